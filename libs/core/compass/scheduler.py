"""The workflow scheduler inside the core: plan on arrival, dispatch when ready, adjust.

A workflow job is planned whole when it arrives (``planner.Planner``): every
task gets a GPU and an estimated start. A task is sent to its GPU (a ``Place``
carrying a ``ServingTask``) only when its inputs are ready: roots at once, the
others when their last parent ends. At that moment ``compass`` may adjust: if
the planned GPU's queue would keep the task waiting longer than
``adjust_threshold`` × its run time, it goes where wait plus load is lowest;
``jit`` always re-routes; ``heft`` and ``hash`` keep the plan.

Under overload ``compass`` also holds new workflows back: while a plan would
keep a workflow's first task waiting longer than ``hold_threshold`` × its
best-case time, it stays in the scheduler's queue, oldest first (per GPU type).
The tasks of workflows already under way then meet short GPU queues instead
of queueing behind the roots of every newer workflow, which at 2.5× overload
cuts the median slowdown by a third.

How serving shares the cluster with batch work: workflows plan over the GPUs
already serving plus free GPUs, while serving holds at most
``serving_max_fraction`` of the cluster. A GPU joins serving when a plan first
uses it (it is taken from the batch ``Capacity``) and goes back to batch work
``serving_linger_s`` after its queue drains, so a steady stream of workflows
keeps its GPUs and their warm models. Waiting workflows go before every batch
tier when GPUs free up: they are the latency-sensitive fast path.

The GPU's memory is a model cache kept by its node agent; ``ModelLoaded`` and
``ModelEvicted`` inputs keep this view of it current. All times here are ms
on the input clock. What serving remembers is declared in tables of the
scheduler's ``State`` (prefixed ``serving.``), so its digest covers them; the
GPUs it uses are borrowed through ``BatchGpus``, the scheduler's narrow view of
its capacity.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from libs.core.compass.planner import (
    Assignment,
    GpuState,
    Input,
    Pending,
    PlanMode,
    Planner,
    Timeline,
)
from libs.core.compass.workflow import BYTES_PER_MB, Costs, Task, Workflow
from libs.core.config import PolicyConfig
from libs.core.decisions import (
    Cancel,
    Decision,
    JobLost,
    Place,
    Planned,
    PlannedTask,
    ServingTask,
    Stop,
    StopCause,
    TaskLost,
    Wait,
)
from libs.core.ids import workflow_task_id
from libs.core.limits import MAX_UPCOMING
from libs.core.model import JobSpec, NodeSpec
from libs.core.state import Cell, State, Table

GpuKey = tuple[str, int]  # (node id, GPU index)
MB_PER_GIB = (1 << 30) / BYTES_PER_MB  # node memory is in GiB


class BatchGpus(Protocol):
    """What serving may see and do of the batch scheduler's GPUs."""

    @property
    def total_gpus(self) -> int: ...

    @property
    def total_free(self) -> int: ...

    def node(self, node_id: str) -> NodeSpec | None:
        """A registered node, or None."""
        ...

    def free_gpus(self) -> Iterator[GpuKey]:
        """The free GPUs serving may take (none on nodes reserved for batch work),
        in node order."""
        ...

    def take(self, key: GpuKey) -> None: ...

    def give(self, key: GpuKey) -> None: ...


@dataclass
class _Gpu:
    """One GPU as serving sees it.

    ``planned`` and ``dispatched`` map task ids, in the order they came, to their
    part of the GPU's fact in the digest: ``(task id, when its inputs arrive)``,
    kept written out so that a fact costs a join, not a pass over the tasks.
    """

    key: GpuKey
    memory_mb: float
    resident: dict[str, float] = field(default_factory=dict)  # model -> MB, as reported
    planned: dict[str, str] = field(default_factory=dict)  # planned here, not sent yet
    dispatched: dict[str, str] = field(default_factory=dict)  # sent, not yet ended
    started: dict[str, float] = field(default_factory=dict)  # task id -> start (ms)
    planned_models: Counter[str] = field(default_factory=Counter)  # of the planned tasks
    # Dispatched tasks whose part is written again at the GPU's next touch: the time
    # their inputs arrive became known just after their send touched the GPU.
    restated: set[str] = field(default_factory=set)

    @property
    def busy(self) -> bool:
        return bool(self.planned or self.dispatched)

    @property
    def label(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    def plan(self, task_id: str, model: str, part: str) -> None:
        self.planned[task_id] = part
        if model:
            self.planned_models[model] += 1

    def unplan(self, task_id: str, model: str) -> None:
        if self.planned.pop(task_id, None) is not None and model:
            self.planned_models[model] -= 1
            if not self.planned_models[model]:
                del self.planned_models[model]


class _Flow:
    """A planned workflow: where each task runs and how far it got.

    Its fact in the digest names every task; the parts are kept written out in
    task-name order, so that writing the fact after each change costs a join,
    not a sort of the whole workflow.
    """

    def __init__(self, job_id: str, spec: JobSpec, workflow: Workflow, gpu: dict[str, GpuKey]):
        self.job_id = job_id
        self.spec = spec
        self.workflow = workflow
        self.gpu = gpu  # task name -> its GPU: planned, then where it was sent (see move)
        self.parents_left = {t.task_id: len(t.parents) for t in workflow.tasks}
        self.finished: dict[str, float] = {}  # task name -> end (ms)
        self.dispatched: set[str] = set()
        self.in_flight: dict[str, None] = {}  # sent to a GPU, not ended
        self.ended = False  # failed or cancelled: nothing more is sent
        self.abandoned: tuple[GpuKey, ...] = ()  # the GPUs its unsent tasks were planned on
        names = sorted(gpu)
        self._index = {name: i for i, name in enumerate(names)}
        self._gpu_parts = [repr((name, gpu[name])) for name in names]
        self._finished_parts: list[str | None] = [None] * len(names)
        self._dispatched_parts: list[str | None] = [None] * len(names)

    def move(self, name: str, key: GpuKey) -> None:
        self.gpu[name] = key
        self._gpu_parts[self._index[name]] = repr((name, key))

    def dispatch(self, name: str) -> None:
        self.dispatched.add(name)
        self.in_flight[name] = None
        self._dispatched_parts[self._index[name]] = repr(name)

    def finish(self, name: str, at_ms: float) -> None:
        self.finished[name] = at_ms
        self.in_flight.pop(name, None)
        self._finished_parts[self._index[name]] = repr((name, at_ms))

    def fact(self) -> str:
        """``f|job|sorted(gpu.items())|sorted(finished.items())|sorted(dispatched)|ended``."""
        return (
            f"f|{self.job_id}|[{', '.join(self._gpu_parts)}]"
            f"|[{', '.join(filter(None, self._finished_parts))}]"
            f"|[{', '.join(filter(None, self._dispatched_parts))}]|{self.ended}"
        )


@dataclass
class _Line:
    """A GPU's timeline as of ``now_ms``, with the item of each task in it. Each
    send edits it in place; any other change to the GPU drops it (see _touch)."""

    now_ms: float
    timeline: Timeline
    items: dict[str, Pending]  # task id -> its item in the timeline


class _NotPlanned(enum.Enum):
    NO_GPU = enum.auto()  # none may take it now
    HELD = enum.auto()  # a plan would start it too late: see _holds


def _part(task_id: str, ready_ms: float | None) -> str:
    return repr((task_id, ready_ms))


def _gpu_fact(gpu: _Gpu) -> str:
    return (
        f"{gpu.memory_mb}|{list(gpu.resident.items())}"
        f"|[{', '.join(gpu.planned.values())}]|[{', '.join(gpu.dispatched.values())}]"
        f"|{sorted(gpu.started.items())}"
    )


class Serving:
    """Workflow serving. What it remembers is declared in ``state``; every other
    attribute is config, the ``BatchGpus`` it borrows from, or a cache derived from
    declared state (``DERIVED``, rebuilt by ``derived``)."""

    # ``_lines`` is a cache of ``_line``: each kept timeline is dropped on any change
    # to its GPU (``_touch``) and edited on a send exactly as a rebuild would be (held
    # to it by test_kept_timelines_decide_as_timelines_built_afresh_for_every_send).
    DERIVED = ("_tasks", "_lines")

    def __init__(self, config: PolicyConfig, state: State, gpus: BatchGpus) -> None:
        self.config = config
        self.mode = PlanMode(config.serving_mode)
        self._costs = Costs(config.host_to_gpu_mb_per_ms, config.node_to_node_mb_per_ms, 0.0)
        self._planner = Planner(self._costs, self.mode)
        self._batch = gpus
        # A GPU's queue and a workflow's progress are large: hashed when the digest is read.
        self._gpus: Table[GpuKey, _Gpu] = state.table("serving.gpus", _gpu_fact, large=True)
        self.pool: Table[GpuKey, None] = state.table("serving.pool")  # held from batch work
        self._idle_since: Table[GpuKey, float] = state.table("serving.idle")  # pool, queue empty
        self._flows: Table[str, _Flow] = state.table("serving.flows", _Flow.fact, large=True)
        # task id -> the task as its GPU's backlog holds it, with when its inputs arrive
        # there: the plan's estimate, then (once sent) the known time. The planner
        # plays each GPU's backlog forward.
        self._items: Table[str, Pending] = state.table("serving.items")
        # Workflows no GPU could take, in order.
        self.waiting: Table[str, JobSpec] = state.table("serving.waiting")
        # The pool is backed up and had no free GPU to grow onto: the next GPU batch
        # work frees joins it (GPU type, model size it must hold).
        self._hungry: Cell[tuple[str, float] | None] = state.cell("serving.hungry", None)
        # Derived caches (see ``derived``).
        self._tasks: dict[str, tuple[str, Task]] = {}  # task id -> (job id, task), in flight
        self._lines: dict[GpuKey, _Line] = {}  # timelines kept for adjusting (see _line)

    def derived(self) -> dict[str, object]:
        """``_tasks`` rebuilt from the flows: their tasks not yet ended, but for the
        unsent ones of an abandoned flow."""
        tasks = {
            workflow_task_id(flow.job_id, task.task_id): (flow.job_id, task)
            for flow in self._flows.values()
            for task in flow.workflow.tasks
            if task.task_id not in flow.finished
            and (not flow.ended or task.task_id in flow.dispatched)
        }
        return {"_tasks": tasks}

    # -- facts from the log --------------------------------------------------

    def add_node(self, node: NodeSpec) -> None:
        for index in node.gpu_indices:
            key = (node.node_id, index)
            gpu = self._gpus.setdefault(key, _Gpu(key, 0.0))
            gpu.memory_mb = node.gpu_memory_gib * MB_PER_GIB
            self._touch(gpu)

    def owns(self, task_id: str, node_id: str) -> bool:
        """Whether the task is a workflow task sent to (or planned on) ``node_id``; a
        report from any other node is not believed."""
        known = self._tasks.get(task_id)
        return known is not None and self._flows[known[0]].gpu[known[1].task_id][0] == node_id

    def loaded(self, node_id: str, gpu_index: int, model: str, size_mb: float) -> None:
        gpu = self._gpus.get((node_id, gpu_index))
        if gpu is not None:
            gpu.resident[model] = size_mb
            self._touch(gpu)

    def evicted(self, node_id: str, gpu_index: int, model: str) -> None:
        gpu = self._gpus.get((node_id, gpu_index))
        if gpu is not None and gpu.resident.pop(model, None) is not None:
            self._touch(gpu)

    def started(self, task_id: str, now_ms: float) -> None:
        job_id, task = self._tasks[task_id]
        gpu = self._gpus[self._flows[job_id].gpu[task.task_id]]
        if task_id in gpu.dispatched:
            gpu.started[task_id] = now_ms
            if task.model in gpu.resident:  # most recently used now, as the agent's cache
                gpu.resident[task.model] = gpu.resident.pop(task.model)
            self._touch(gpu)

    def ended(self, task_id: str, exit_code: int, now_ms: float) -> list[Decision]:
        """A task ended: send the successors it unblocked, or give up on a failed flow."""
        job_id, task = self._tasks.pop(task_id)
        self._items.pop(task_id, None)
        flow = self._flows[job_id]
        gpu = self._gpus[flow.gpu[task.task_id]]
        gpu.dispatched.pop(task_id, None)
        gpu.started.pop(task_id, None)
        self._touch(gpu, now_ms)
        flow.finish(task.task_id, now_ms)
        decisions: list[Decision] = []
        if exit_code != 0:
            self._abandon(flow, now_ms)
        elif not flow.ended:
            for child in flow.workflow.children(task.task_id):
                flow.parents_left[child] -= 1
                if flow.parents_left[child] == 0:
                    decisions += self._send(flow, flow.workflow.task(child), now_ms)
        self._touch_flow(flow)
        if len(flow.finished) == len(flow.workflow.tasks) or (flow.ended and not flow.in_flight):
            self._forget(flow)
        return decisions

    # -- decisions -----------------------------------------------------------

    def arrive(self, job_id: str, spec: JobSpec, now_ms: float) -> list[Decision]:
        self.waiting[job_id] = spec
        decisions = self.retry(now_ms)  # older workflows first
        if job_id in self.waiting:
            decisions.append(Wait(job_id, self._why_waiting(spec)))
        return decisions

    def retry(self, now_ms: float) -> list[Decision]:
        """Plan waiting workflows, oldest first; one no GPU can hold does not block the
        rest, one held back holds back the younger ones of its GPU type."""
        decisions: list[Decision] = []
        held: set[str] = set()
        for job_id, spec in list(self.waiting.items()):
            if not self.pool and not self._batch.total_free:
                break
            if spec.gpu_type in held:
                continue
            planned = self._plan(job_id, spec, now_ms)
            if planned is _NotPlanned.HELD:
                held.add(spec.gpu_type)
            elif planned is not _NotPlanned.NO_GPU:
                del self.waiting[job_id]
                decisions += planned
        return decisions

    def grow(self, now_ms: float) -> None:
        """Take a freed GPU for a backed-up pool, before batch work can.

        Workflows plan onto the pool's queues when no GPU is free, so on a full
        cluster none of them ever waits; this is how serving still grows there.
        """
        hungry = self._hungry.value
        if hungry is None or len(self.pool) >= self._cap:
            return
        gpu_type, need_mb = hungry
        for key in self._batch.free_gpus():
            gpu = self._gpus[key]
            node = self._batch.node(key[0])
            assert node is not None  # its GPU is free
            if gpu.memory_mb >= need_mb and (not gpu_type or node.gpu_type == gpu_type):
                self._acquire(gpu)
                self._touch(gpu, now_ms)  # idle: it lingers unless a plan uses it
                self._set_hungry(None)
                return

    def release_idle(self, now_ms: float) -> None:
        """Give GPUs whose queue drained ``serving_linger_s`` ago back to batch work."""
        linger_ms = self.config.serving_linger_s * 1000
        while self._idle_since:
            key, since = self._idle_since.first()
            if since + linger_ms > now_ms:
                return
            del self._idle_since[key]
            del self.pool[key]
            self._batch.give(key)
            self._touch(self._gpus[key])

    def lose(self, node_id: str, why: str, now_ms: float) -> list[Decision]:
        """A node was lost, or its agent restarted: the tasks sent there are lost, and
        with them every workflow that sent or planned a task there (its other tasks
        under way are stopped); the node's GPUs leave the pool, their models gone."""
        keys = sorted(key for key in self._gpus if key[0] == node_id)
        hit: dict[str, None] = {}  # the workflows lost, in a deterministic order
        for key in keys:
            gpu = self._gpus[key]
            for task_id in (*gpu.dispatched, *gpu.planned):
                hit[self._tasks[task_id][0]] = None
        decisions: list[Decision] = []
        for job_id in hit:
            decisions += self._lose_flow(self._flows[job_id], node_id, why, now_ms)
        for key in keys:
            gpu = self._gpus[key]
            if key in self.pool:  # back to the node's capacity: free when it returns
                del self.pool[key]
                self._batch.give(key)
            self._idle_since.pop(key, None)
            gpu.resident.clear()
            self._touch(gpu)
        return decisions

    def _lose_flow(self, flow: _Flow, node_id: str, why: str, now_ms: float) -> list[Decision]:
        self._abandon(flow, now_ms)
        decisions: list[Decision] = []
        for name in sorted(flow.in_flight):
            task_id = workflow_task_id(flow.job_id, name)
            at = flow.gpu[name]
            if at[0] != node_id:
                decisions.append(Stop(flow.job_id, task_id, at[0], StopCause.NODE_LOST, why))
                continue
            decisions.append(TaskLost(flow.job_id, task_id, node_id, why))
            gpu = self._gpus[at]
            gpu.dispatched.pop(task_id, None)
            gpu.started.pop(task_id, None)
            self._tasks.pop(task_id, None)
            self._items.pop(task_id, None)
            flow.finish(name, now_ms)
            self._touch(gpu, now_ms)
        decisions.append(JobLost(flow.job_id, f"{why}; a workflow does not go on without it"))
        self._touch_flow(flow)
        if not flow.in_flight:
            self._forget(flow)
        return decisions

    def cancel(self, job_id: str, now_ms: float) -> list[Decision] | None:
        """Withdraw a workflow; None when the job is not a workflow this knows."""
        if self.waiting.pop(job_id) is not None:
            return [Cancel(job_id, "cancelled before it started")]
        flow = self._flows.get(job_id)
        if flow is None:
            return None
        if flow.ended:
            return []
        self._abandon(flow, now_ms)
        self._touch_flow(flow)
        decisions: list[Decision] = [Cancel(job_id, "cancelled by user")]
        for name in sorted(flow.in_flight):
            node_id, _ = flow.gpu[name]
            task_id = workflow_task_id(job_id, name)
            decisions.append(Stop(job_id, task_id, node_id, StopCause.CANCELLED, "cancelled"))
        if not flow.in_flight:
            self._forget(flow)
        return decisions

    def held_on(self, node_id: str) -> set[int]:
        return {index for node, index in self.pool if node == node_id}

    def allocation_of(self, job_id: str) -> str:
        spec = self.waiting.get(job_id)
        if spec is None:
            spec = self._flows[job_id].spec
        return spec.allocation

    def describe(self, job_id: str) -> str | None:
        """What a workflow is doing, for ``qm why``; None when it is not one."""
        spec = self.waiting.get(job_id)
        if spec is not None:
            ahead = list(self.waiting).index(job_id)
            return f"{self._why_waiting(spec)}; {ahead} workflow(s) ahead of it"
        flow = self._flows.get(job_id)
        if flow is None:
            return None
        parts = [f"workflow {flow.workflow.name} ({self.mode.value} plan)"]
        parts.append(f"{len(flow.finished)} of {len(flow.workflow.tasks)} tasks done")
        for task in flow.workflow.tasks:
            if task.task_id in flow.finished:
                continue
            state = "sent to" if task.task_id in flow.dispatched else "planned on"
            node_id, index = flow.gpu[task.task_id]
            parts.append(f"{task.task_id} {state} {node_id} GPU {index}")
        return "; ".join(parts)

    # -- planning ------------------------------------------------------------

    def _plan(self, job_id: str, spec: JobSpec, now_ms: float) -> list[Decision] | _NotPlanned:
        workflow = spec.workflow
        assert workflow is not None
        need_mb = workflow.largest_model_mb
        views = self._views(spec, workflow, need_mb, now_ms)
        if not views:
            return _NotPlanned.NO_GPU
        plan = self._planner.plan(workflow, list(views.values()), now_ms, job_id=job_id)
        by_label = {self._gpus[key].label: key for key in views}
        if all(key in self.pool for key in views):
            backed_up = any(
                a.wait_ms > self.config.adjust_threshold * t.run_ms
                for a, t in zip(plan, workflow.tasks, strict=True)
                if not t.parents
            )
            if backed_up:
                self._set_hungry((spec.gpu_type, need_mb))
        if self._holds(workflow, plan):
            return _NotPlanned.HELD  # the views were copies: nothing to undo
        flow = _Flow(job_id, spec, workflow, gpu={a.task_id: by_label[a.gpu_id] for a in plan})
        self._flows[job_id] = flow
        for task, assignment in zip(workflow.tasks, plan, strict=True):
            task_id = workflow_task_id(job_id, task.task_id)
            self._tasks[task_id] = (job_id, task)
            self._items[task_id] = Pending(
                task.model, task.model_mb, task.run_ms, assignment.ready_ms, sent=False
            )
            gpu = self._gpus[flow.gpu[task.task_id]]
            gpu.plan(task_id, task.model, _part(task_id, assignment.ready_ms))
            self._acquire(gpu)
        decisions: list[Decision] = [
            Planned(
                job_id,
                self.mode.value,
                tuple(
                    PlannedTask(a.task_id, *by_label[a.gpu_id], a.start_ms, a.finish_ms, a.load_ms)
                    for a in plan
                ),
            )
        ]
        for task in workflow.tasks:
            if not task.parents:
                decisions += self._send(flow, task, now_ms)
        self._touch_flow(flow)
        return decisions

    def _holds(self, workflow: Workflow, plan: list[Assignment]) -> bool:
        """compass under overload: the plan would start the workflow too late to send it now."""
        hold = self.config.hold_threshold
        if self.mode is not PlanMode.COMPASS or not hold:
            return False
        # The queue ahead of its first task, not the load or eviction penalty: a
        # hold that waited for those would wait forever on a GPU that must evict.
        wait = min(a.wait_ms for a, t in zip(plan, workflow.tasks, strict=True) if not t.parents)
        best_ms = max(self._planner.upward_ranks(workflow).values())  # its critical path
        return wait > hold * best_ms

    def _views(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float
    ) -> dict[GpuKey, GpuState]:
        """The GPUs a plan may use (see _candidates), as the planner sees them."""
        return {
            key: self._view(self._gpus[key], now_ms)
            for key in self._candidates(spec, workflow, need_mb)
        }

    def _candidates(self, spec: JobSpec, workflow: Workflow, need_mb: float) -> list[GpuKey]:
        """The GPUs a plan may use: those serving now, then free ones while serving
        has room: first those already holding one of its models, then in node order.
        The hash baselines spread over every eligible GPU."""

        chosen = [key for key in self.pool if self._fits(key, spec.gpu_type, need_mb)]
        room = self._cap - len(self.pool)
        if room > 0:
            models = workflow.models
            free = [k for k in self._batch.free_gpus() if self._fits(k, spec.gpu_type, need_mb)]
            warm = [key for key in free if models & self._gpus[key].resident.keys()]
            wanted = room if self.mode in (PlanMode.HASH, PlanMode.JIT) else len(workflow.tasks)
            taken = set(warm)
            cold = [key for key in free if key not in taken][:wanted]
            chosen += (warm + cold)[:room]
        return sorted(chosen)

    def _fits(self, key: GpuKey, gpu_type: str, need_mb: float) -> bool:
        """The GPU is registered, of the type asked for, with room for the largest model."""
        gpu = self._gpus.get(key)
        node = self._batch.node(key[0])
        return (
            gpu is not None
            and node is not None
            and gpu.memory_mb >= need_mb
            and (not gpu_type or node.gpu_type == gpu_type)
        )

    def _set_hungry(self, want: tuple[str, float] | None) -> None:
        self._hungry.value = want

    def _view(self, gpu: _Gpu, now_ms: float, *, sent_only: bool = False) -> GpuState:
        """The GPU as the planner sees it: when its running task ends, its models,
        and its backlog (sent, then planned) with when each task's inputs arrive."""
        backlog = tuple(item for _, item in self._backlog(gpu, sent_only))
        return self._state(gpu, now_ms, backlog)

    def _state(self, gpu: _Gpu, now_ms: float, backlog: tuple[Pending, ...]) -> GpuState:
        free_at = now_ms
        for task_id, start in gpu.started.items():
            free_at = max(free_at, start + self._tasks[task_id][1].run_ms)
        return GpuState(gpu.label, gpu.key[0], free_at, dict(gpu.resident), gpu.memory_mb, backlog)

    def _backlog(self, gpu: _Gpu, sent_only: bool = False) -> list[tuple[str, Pending]]:
        """The tasks waiting for the GPU, sent then planned, each with its item."""
        ids = gpu.dispatched.keys() if sent_only else (*gpu.dispatched, *gpu.planned)
        return [(t, self._items[t]) for t in ids if t not in gpu.started]

    def _line(self, gpu: _Gpu, now_ms: float) -> _Line:
        """The GPU's timeline for adjusting, built once and then kept up to date."""
        line = self._lines.get(gpu.key)
        if line is None or line.now_ms != now_ms:
            backlog = self._backlog(gpu)
            reserve = self.mode is not PlanMode.JIT  # as Planner.adjust builds them
            state = self._state(gpu, now_ms, tuple(item for _, item in backlog))
            timeline = Timeline(self._planner, state, now_ms, reserve)
            items = {t: item for t, item in backlog if item.sent or reserve}
            line = self._lines[gpu.key] = _Line(now_ms, timeline, items)
        return line

    def _kept_lines(self, now_ms: float, *keys: GpuKey) -> dict[GpuKey, _Line]:
        return {
            key: line
            for key in keys
            if (line := self._lines.get(key)) is not None and line.now_ms == now_ms
        }

    def _send(self, flow: _Flow, task: Task, now_ms: float) -> list[Decision]:
        """Send a ready task to its GPU, adjusting first when the plan went stale."""
        task_id = workflow_task_id(flow.job_id, task.task_id)
        planned = self._gpus[flow.gpu[task.task_id]]
        planned.unplan(task_id, task.model)
        target, reason = self._adjust(flow, task, planned, now_ms)
        kept = self._kept_lines(now_ms, planned.key, target.key)
        self._touch(planned, now_ms)
        if target is not planned:
            flow.move(task.task_id, target.key)
            self._acquire(target)
        target.dispatched[task_id] = _part(task_id, self._ready(task_id))
        self._touch(target)
        target.restated.add(task_id)  # its arrival, set below, shows from the next touch
        flow.dispatch(task.task_id)
        arrival = max(
            (
                flow.finished[p]
                + self._costs.transfer_ms(task.in_kb, flow.gpu[p][0] == target.key[0])
                for p in task.parents
            ),
            default=now_ms,
        )
        item = self._items[task_id] = Pending(
            task.model, task.model_mb, task.run_ms, arrival, sent=True
        )
        # The two timelines follow the send (the touches above dropped them).
        for key, line in kept.items():
            left = line.items.pop(task_id, None)
            sent = None
            if key == target.key:
                sent = line.items[task_id] = item
            line.timeline.replace(None if left is None else line.timeline.find(left), sent)
            self._lines[key] = line
        serving = ServingTask(
            task.task_id,
            task.model,
            task.model_mb,
            task.run_ms,
            max(0.0, arrival - now_ms),
            self._upcoming(target),
            planned.key if target is not planned else None,
            reason,
        )
        return [Place(flow.job_id, task_id, target.key[0], (target.key[1],), flow.spec, serving)]

    def _adjust(self, flow: _Flow, task: Task, planned: _Gpu, now_ms: float) -> tuple[_Gpu, str]:
        if self.mode is PlanMode.COMPASS:
            threshold = self.config.adjust_threshold
            if len(task.parents) > 1 and not self.config.adjust_joins:
                return planned, ""
        elif self.mode is PlanMode.JIT:
            threshold = 0.0
        else:
            return planned, ""
        task_id = workflow_task_id(flow.job_id, task.task_id)
        # A task ready now waits only for what was sent before it (the planned tasks,
        # this one among them, go after it): a kept timeline answers, or those alone.
        kept = self._kept_lines(now_ms, planned.key).get(planned.key)
        if kept is not None:
            wait = kept.timeline.wait(now_ms)
        else:
            wait = self._planner.wait_ms(self._view(planned, now_ms, sent_only=True), now_ms)
        if threshold and wait <= threshold * task.run_ms:
            return planned, ""  # the common case: no need to look at other GPUs
        inputs = [Input(flow.gpu[p][0], flow.finished[p]) for p in task.parents]
        own = self._line(planned, now_ms)
        self._leave_behind(own, task_id, task, now_ms, inputs)
        lines = {
            self._line(self._gpus[key], now_ms).timeline: key
            for key in self._candidates(flow.spec, flow.workflow, task.model_mb)
        }
        chosen = self._planner.adjust_lines(
            task, own.timeline, list(lines), now_ms, threshold, inputs=inputs
        )
        if chosen is own.timeline:
            return planned, ""
        target = self._gpus[lines[chosen]]
        if self.mode is PlanMode.JIT:
            return target, "re-routed at run time (jit)"
        return target, (
            f"{wait:.0f} ms wait on {planned.label} exceeds {threshold:g}× its "
            f"{task.run_ms:g} ms run"
        )

    def _leave_behind(
        self, own: _Line, task_id: str, task: Task, now_ms: float, inputs: list[Input]
    ) -> None:
        """Weigh the planned GPU without the task (its item is still in the kept
        timeline, to be moved there in one edit if it stays): only an item ahead of
        the task's own turn makes a difference, and is taken out now."""
        item = own.items.get(task_id)
        if item is None:
            return
        ready = self._planner.ready_at(task, own.timeline.node_id, now_ms, inputs)
        at = own.timeline.find(item)
        if at < own.timeline.slot(ready):
            own.timeline.replace(at, None)
            del own.items[task_id]

    # -- bookkeeping ---------------------------------------------------------

    def _acquire(self, gpu: _Gpu) -> None:
        if gpu.key not in self.pool:
            self.pool[gpu.key] = None
            self._batch.take(gpu.key)
        self._touch(gpu)

    def _abandon(self, flow: _Flow, now_ms: float) -> None:
        """Stop sending a failed or cancelled flow's tasks; planned ones are dropped.

        Again (another task failed): only the GPUs they were planned on are touched,
        as going through the dropped tasks once more would.
        """
        if flow.ended:
            for key in flow.abandoned:
                self._touch(self._gpus[key], now_ms)
            return
        flow.ended = True
        abandoned: dict[GpuKey, None] = {}
        for task in flow.workflow.tasks:
            if task.task_id in flow.dispatched:
                continue
            task_id = workflow_task_id(flow.job_id, task.task_id)
            self._tasks.pop(task_id, None)
            self._items.pop(task_id, None)
            gpu = self._gpus[flow.gpu[task.task_id]]
            gpu.unplan(task_id, task.model)
            self._touch(gpu, now_ms)
            abandoned[gpu.key] = None
        flow.abandoned = tuple(abandoned)

    def _forget(self, flow: _Flow) -> None:
        del self._flows[flow.job_id]
        for task in flow.workflow.tasks:
            self._tasks.pop(workflow_task_id(flow.job_id, task.task_id), None)
            self._items.pop(workflow_task_id(flow.job_id, task.task_id), None)

    def _touch(self, gpu: _Gpu, now_ms: float | None = None) -> None:
        """Fold a GPU's change into the digest; a drained pool GPU starts lingering.

        Every change to what its fact reads is followed by a touch, so the fact,
        written when the digest is read, is what it would have been here.
        """
        if gpu.busy:
            self._idle_since.pop(gpu.key)
        elif now_ms is not None and gpu.key in self.pool and gpu.key not in self._idle_since:
            self._idle_since[gpu.key] = now_ms
        for task_id in gpu.restated:
            if task_id in gpu.dispatched:
                gpu.dispatched[task_id] = _part(task_id, self._ready(task_id))
        gpu.restated.clear()
        self._lines.pop(gpu.key, None)
        self._gpus.touch(gpu.key)

    def _ready(self, task_id: str) -> float | None:
        item = self._items.get(task_id)
        return None if item is None else item.ready_ms

    def _touch_flow(self, flow: _Flow) -> None:
        self._flows.touch(flow.job_id)

    def _upcoming(self, gpu: _Gpu) -> tuple[str, ...]:
        """The models planned on the GPU, each once, in plan order (its cache's look-ahead),
        the soonest ``MAX_UPCOMING``: enough to evict by, and a bound on the record."""
        models: dict[str, None] = {}
        for task_id in gpu.planned:
            if len(models) in (len(gpu.planned_models), MAX_UPCOMING):
                break  # seen them all (the rest of the queue adds none), or enough
            model = self._tasks[task_id][1].model
            if model:
                models[model] = None
        return tuple(models)

    @property
    def _cap(self) -> int:
        return math.ceil(self.config.serving_max_fraction * self._batch.total_gpus)

    def _why_waiting(self, spec: JobSpec) -> str:
        assert spec.workflow is not None
        need_mb = spec.workflow.largest_model_mb
        kind = spec.gpu_type or "any type"
        if not any(self._fits(key, spec.gpu_type, need_mb) for key in self._gpus):
            return (
                f"needs a GPU ({kind}) with room for a {need_mb:g} MB model; "
                "no registered GPU has that much memory"
            )
        if any(self._fits(key, spec.gpu_type, need_mb) for key in self.pool):
            # Only a hold keeps a workflow waiting while GPUs that can take it serve.
            return (
                "held while the serving GPUs work through their queues: a plan now would "
                f"start it more than {self.config.hold_threshold:g}× its best-case time late; "
                "held workflows go oldest first"
            )
        cap = self._cap
        if len(self.pool) >= cap:
            return f"waiting for a serving GPU: serving holds its limit of {cap} GPUs"
        return (
            f"waiting for a GPU free of batch work (serving holds {len(self.pool)} "
            f"of at most {cap})"
        )
