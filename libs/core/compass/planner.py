"""Planning a workflow onto GPUs: Compass, and the baselines it is compared with.

``compass`` ranks tasks HEFT-style (upward rank, transfers included) and gives
each the GPU with the earliest estimated start: max(GPU free, inputs arrived,
transfers included) plus the model load when the model is not resident, plus
an eviction penalty (the reload cost of what must make room). ``heft`` plans
the same way but blind to loads and caches. ``hash`` and ``jit`` place by a
stable hash of the task; ``jit`` then re-routes every task when it becomes
ready. ``adjust`` is Compass's run-time correction.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from libs.core.compass.cache import evict_for
from libs.core.compass.workflow import Costs, Task, Workflow


class PlanMode(enum.Enum):
    COMPASS = "compass"
    HEFT = "heft"
    HASH = "hash"
    JIT = "jit"


@dataclass
class GpuState:
    """What the planner believes of one GPU; it updates these as it plans."""

    gpu_id: str
    node_id: str
    free_at_ms: float
    resident: dict[str, float] = field(default_factory=dict)  # model -> MB
    memory_mb: float = 0.0  # 0: the cluster-wide Costs.gpu_memory_mb


@dataclass(frozen=True)
class Assignment:
    task_id: str
    gpu_id: str
    start_ms: float  # when the task starts running (after any load)
    finish_ms: float
    load_ms: float  # 0 on a cache hit


class Planner:
    def __init__(self, costs: Costs, mode: PlanMode = PlanMode.COMPASS) -> None:
        self.costs = costs
        self.mode = mode

    def upward_ranks(self, workflow: Workflow) -> dict[str, float]:
        ranks: dict[str, float] = {}
        for task in reversed(workflow.tasks):
            tail = max(
                (
                    self.costs.transfer_ms(task.out_kb, same_node=False) + ranks[child]
                    for child in workflow.children(task.task_id)
                ),
                default=0.0,
            )
            ranks[task.task_id] = task.run_ms + tail
        return ranks

    def plan(
        self, workflow: Workflow, gpus: Sequence[GpuState], now_ms: float, job_id: str = ""
    ) -> list[Assignment]:
        """Assign every task of one job; ``gpus`` are updated to reflect the plan.

        The hash baselines hash the job and the task, spreading jobs over all GPUs.
        """
        ranks = self.upward_ranks(workflow)
        order = sorted(workflow.tasks, key=lambda t: (-ranks[t.task_id], workflow.tasks.index(t)))
        done: dict[str, Assignment] = {}
        for task in order:
            if self.mode in (PlanMode.HASH, PlanMode.JIT):
                gpu = gpus[_stable_hash(f"{job_id}/{workflow.name}/{task.task_id}") % len(gpus)]
                choice = self._estimate(task, gpu, done, gpus, now_ms, aware=True)
            else:
                aware = self.mode is PlanMode.COMPASS
                choice = min(
                    (self._estimate(task, g, done, gpus, now_ms, aware) for g in gpus),
                    key=lambda a: (a.start_ms, a.gpu_id),
                )
            done[task.task_id] = choice
            self._commit(task, choice, gpus)
        return [done[t.task_id] for t in workflow.tasks]

    def adjust(
        self,
        task: Task,
        planned: GpuState,
        gpus: Sequence[GpuState],
        ready_ms: float,
        threshold: float = 1.5,
    ) -> GpuState:
        """Re-place a ready task whose planned GPU's wait exceeds ``threshold`` × its run
        time (``threshold`` 0: always take the GPU with the lowest wait plus load)."""
        wait = max(0.0, planned.free_at_ms - ready_ms)
        if threshold and wait <= threshold * task.run_ms:
            return planned
        return min(
            gpus,
            key=lambda g: (
                max(0.0, g.free_at_ms - ready_ms) + self._load_ms(task, g),
                g.gpu_id,
            ),
        )

    def _estimate(
        self,
        task: Task,
        gpu: GpuState,
        done: dict[str, Assignment],
        gpus: Sequence[GpuState],
        now_ms: float,
        aware: bool,
    ) -> Assignment:
        node_of = {g.gpu_id: g.node_id for g in gpus}
        inputs = max(
            (
                done[p].finish_ms
                + self.costs.transfer_ms(task.in_kb, node_of[done[p].gpu_id] == gpu.node_id)
                for p in task.parents
            ),
            default=now_ms,
        )
        begin = max(gpu.free_at_ms, inputs, now_ms)
        load = self._load_ms(task, gpu)
        penalty = self._eviction_penalty(task, gpu) if aware else 0.0
        start = begin + (load + penalty if aware else 0.0)
        return Assignment(task.task_id, gpu.gpu_id, start, start + task.run_ms, load)

    def _commit(self, task: Task, choice: Assignment, gpus: Sequence[GpuState]) -> None:
        gpu = next(g for g in gpus if g.gpu_id == choice.gpu_id)
        gpu.free_at_ms = max(gpu.free_at_ms, choice.finish_ms)
        if task.model and task.model not in gpu.resident:
            for model in self._victims(task, gpu) or ():
                del gpu.resident[model]
            gpu.resident[task.model] = task.model_mb

    def _load_ms(self, task: Task, gpu: GpuState) -> float:
        if not task.model or task.model in gpu.resident:
            return 0.0
        return self.costs.load_ms(task.model_mb)

    def _victims(self, task: Task, gpu: GpuState) -> tuple[str, ...] | None:
        memory = gpu.memory_mb or self.costs.gpu_memory_mb
        return evict_for(task.model_mb, memory, gpu.resident, {})

    def _eviction_penalty(self, task: Task, gpu: GpuState) -> float:
        if not task.model or task.model in gpu.resident:
            return 0.0
        victims = self._victims(task, gpu)
        if victims is None:
            return float("inf")
        return sum(self.costs.load_ms(gpu.resident[m]) for m in victims)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
