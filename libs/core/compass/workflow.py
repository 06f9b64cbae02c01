"""Workflows: DAGs of tasks, each serving one model. Invalid DAGs are refused by task."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from graphlib import CycleError, TopologicalSorter

BYTES_PER_MB = 1_000_000  # model sizes and GPU caches are counted in MB of 10^6 bytes


class WorkflowError(ValueError):
    """The workflow breaks a rule; the message names the task."""


class CacheModel(enum.Enum):
    """How a worker's model cache makes room (``libs.core.compass.cache``)."""

    LOOKAHEAD = "lookahead"  # models needed furthest ahead go first, for free
    FIFO_COST = "fifo-cost"  # models loaded first go first, each costing its transfer


@dataclass(frozen=True)
class Costs:
    """Transfer rates: loading a model costs size ÷ host-to-GPU bandwidth; and how the
    workers' caches make room."""

    host_to_gpu_mb_per_ms: float
    node_to_node_mb_per_ms: float
    gpu_memory_mb: float
    cache_model: CacheModel = CacheModel.LOOKAHEAD

    def load_ms(self, size_mb: float) -> float:
        return size_mb / self.host_to_gpu_mb_per_ms

    def transfer_ms(self, kb: float, same_node: bool) -> float:
        return 0.0 if same_node else kb / 1000 / self.node_to_node_mb_per_ms + 0.002


@dataclass(frozen=True)
class Task:
    task_id: str
    model: str  # empty: no model (glue code)
    model_mb: float
    run_ms: float
    in_kb: float
    out_kb: float
    parents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workflow:
    name: str
    tasks: tuple[Task, ...]  # in topological order

    def task(self, task_id: str) -> Task:
        return self._by_id[task_id]

    def children(self, task_id: str) -> tuple[str, ...]:
        """The tasks that name ``task_id`` as a parent, in workflow order."""
        return self._children.get(task_id, ())

    @cached_property
    def best_case_ms(self) -> float:
        """Its latency with no queueing and every model resident: the longest chain of
        run times through the DAG (the yardstick of its slowdown)."""
        done: dict[str, float] = {}
        for task in self.tasks:  # parents first
            done[task.task_id] = task.run_ms + max((done[p] for p in task.parents), default=0.0)
        return max(done.values(), default=0.0)

    @cached_property
    def work_ms(self) -> float:
        """The GPU time its tasks run, all together."""
        return sum(t.run_ms for t in self.tasks)

    @cached_property
    def largest_model_mb(self) -> float:
        """The GPU memory its largest model needs (0: no task has a model)."""
        return max((t.model_mb for t in self.tasks), default=0.0)

    @cached_property
    def models(self) -> frozenset[str]:
        """The models its tasks serve."""
        return frozenset(t.model for t in self.tasks if t.model)

    # Indexes built on first use, so that looking a task up costs O(1) however large
    # the workflow (the first task of an id wins, as in a workflow not yet checked).
    @cached_property
    def _by_id(self) -> dict[str, Task]:
        by_id: dict[str, Task] = {}
        for task in self.tasks:
            by_id.setdefault(task.task_id, task)
        return by_id

    @cached_property
    def _children(self) -> dict[str, tuple[str, ...]]:
        children: dict[str, list[str]] = {}
        for task in self.tasks:
            for parent in dict.fromkeys(task.parents):
                children.setdefault(parent, []).append(task.task_id)
        return {parent: tuple(kids) for parent, kids in children.items()}


def build_workflow(name: str, raw: Sequence[Task], gpu_memory_mb: float) -> Workflow:
    """Check a DAG and order it topologically; the first broken rule names its task.

    ``gpu_memory_mb`` is the largest GPU the cluster has: a model must fit one.
    """
    tasks: dict[str, Task] = {}
    sizes: dict[str, tuple[float, str]] = {}  # model -> (size, first task naming it)
    for task in raw:
        where = f"{name}/{task.task_id}"
        if not task.task_id:
            raise WorkflowError(f"{name}: a task has no id")
        if task.task_id in tasks:
            raise WorkflowError(f"{where}: duplicate task id")
        if task.model:
            if not task.model_mb > 0:
                raise WorkflowError(f"{where}: model {task.model} needs a size > 0 MB")
            if task.model_mb > gpu_memory_mb:
                raise WorkflowError(
                    f"{where}: model {task.model} ({task.model_mb:g} MB) does not fit any GPU "
                    f"(the largest holds {gpu_memory_mb:g} MB)"
                )
            size, first = sizes.setdefault(task.model, (task.model_mb, task.task_id))
            if size != task.model_mb:
                raise WorkflowError(
                    f"{where}: model {task.model} is {task.model_mb:g} MB here "
                    f"but {size:g} MB in task {first}"
                )
        for field in ("run_ms", "in_kb", "out_kb"):
            if not getattr(task, field) > 0:
                raise WorkflowError(f"{where}: {field} must be > 0")
        tasks[task.task_id] = task
    if not tasks:
        raise WorkflowError(f"{name}: a workflow needs at least one task")
    for task in tasks.values():
        for parent in task.parents:
            if parent not in tasks:
                raise WorkflowError(f"{name}/{task.task_id}: unknown parent {parent!r}")
    return Workflow(name, _topological(name, tasks))


def _topological(name: str, tasks: dict[str, Task]) -> tuple[Task, ...]:
    """Tasks in rounds: each round, by id, the tasks whose parents all came in earlier
    rounds (the standard library's topological sorter, one round at a time)."""
    graph = TopologicalSorter({task_id: task.parents for task_id, task in tasks.items()})
    try:
        graph.prepare()
    except CycleError as cycle:
        raise WorkflowError(f"{name}/{min(cycle.args[1])}: part of a cycle") from None
    ordered: list[Task] = []
    while graph.is_active():
        ready = sorted(graph.get_ready())
        ordered += (tasks[task_id] for task_id in ready)
        graph.done(*ready)
    return tuple(ordered)
