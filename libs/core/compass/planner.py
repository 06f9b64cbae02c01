"""Planning a workflow onto GPUs: Compass, and the baselines it is compared with.

``compass`` ranks tasks HEFT-style (upward rank, transfers included) and gives
each the GPU with the earliest estimated start: when the GPU would take the
task (its backlog played forward: ``timeline``), plus the model load when the
model will not be resident then, plus an eviction penalty (the reload cost of
what must make room: ``cache``). ``heft`` plans the same way but blind to loads
and caches. ``hash`` and ``jit`` place by a stable hash of the task; ``jit``
then re-routes every task when it becomes ready. ``adjust`` is Compass's
run-time correction. Ties between GPUs go to the lower ``gpu_id`` (``choice``):
plans are deterministic and pack onto few GPUs when the cluster is lightly
loaded.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from libs.core.compass.cache import load_ms, penalty_ms
from libs.core.compass.choice import Arrivals, Choice, Shortlist
from libs.core.compass.order import GpuOrder
from libs.core.compass.timeline import GpuState, Pending, Timeline
from libs.core.compass.workflow import Costs, Task, Workflow
from libs.core.ids import JobId, NodeId


class PlanMode(enum.Enum):
    COMPASS = "compass"
    HEFT = "heft"
    HASH = "hash"
    JIT = "jit"

    @property
    def hashed(self) -> bool:
        """Each task goes where a stable hash of it says: the baselines that search nothing."""
        return self in (PlanMode.HASH, PlanMode.JIT)

    @property
    def reserves(self) -> bool:
        """A task only planned on a GPU holds its place there (``jit`` plans nothing:
        its hash placement is no reservation)."""
        return self is not PlanMode.JIT


@dataclass(frozen=True)
class Assignment:
    task_id: str  # the task's name in its workflow
    gpu_id: str
    start_ms: float  # when the task starts running (after any load)
    finish_ms: float
    load_ms: float  # 0 on a cache hit
    ready_ms: float = 0.0  # when its inputs arrive there (estimated)
    wait_ms: float = 0.0  # from then until the GPU takes it: the queue ahead of it


@dataclass(frozen=True)
class Input:
    """Where one parent of a ready task ran and when it ended (for ``adjust``)."""

    node_id: NodeId
    finish_ms: float


class Planner:
    def __init__(
        self, costs: Costs, mode: PlanMode = PlanMode.COMPASS, order: GpuOrder | None = None
    ) -> None:
        self.costs = costs
        self.mode = mode
        self.order = GpuOrder() if order is None else order  # who takes GPUs that tie

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
        self,
        workflow: Workflow,
        gpus: Sequence[GpuState],
        now_ms: float,
        job_id: JobId | None = None,
    ) -> list[Assignment]:
        """Assign every task of one job; each joins its GPU's ``backlog`` (not sent).

        The hash baselines hash the job and the task, spreading jobs over all GPUs.
        """
        ranks = self.upward_ranks(workflow)
        order = sorted(
            range(len(workflow.tasks)), key=lambda i: (-ranks[workflow.tasks[i].task_id], i)
        )
        timelines = {g.gpu_id: Timeline(self.costs, g, now_ms, reserve=True) for g in gpus}
        node_of = {g.gpu_id: g.node_id for g in gpus}
        by_id = {g.gpu_id: g for g in gpus}
        hashed = self.mode.hashed
        shortlist = None if hashed else Shortlist(gpus, timelines, self.order)
        insertion = not hashed  # compass and heft
        aware = self.mode is not PlanMode.HEFT
        done: dict[str, Assignment] = {}
        added: dict[str, list[Pending]] = {}  # gpu id -> what this plan puts in its backlog
        for task in (workflow.tasks[i] for i in order):
            arrivals = self._arrivals(task, done, node_of, now_ms)
            choose = Choice(
                self.costs, aware, task, arrivals, timelines, node_of, insertion, self.order
            )
            if shortlist is None:
                key = f"{job_id or ''}/{workflow.name}/{task.task_id}"
                choose.weigh(gpus[_stable_hash(key) % len(gpus)].gpu_id, math.inf)
            else:
                shortlist.weigh(task, arrivals, choose.weigh)
            assert choose.best is not None  # every GPU was weighed or ruled out by one
            start, gpu_id, k, ready, begin, load = choose.best
            choice = Assignment(
                task.task_id, gpu_id, start, start + task.run_ms, load, ready, begin - ready
            )
            done[task.task_id] = choice
            item = Pending(task.model, task.model_mb, task.run_ms, choice.ready_ms, sent=False)
            timelines[choice.gpu_id].insert(k, item)
            if shortlist is not None:
                shortlist.changed(choice.gpu_id)
            added.setdefault(choice.gpu_id, []).append(item)
        for gpu_id, items in added.items():
            gpu = by_id[gpu_id]
            gpu.backlog = (*gpu.backlog, *items)
        return [done[t.task_id] for t in workflow.tasks]

    def timeline(self, gpu: GpuState, now_ms: float) -> Timeline:
        """The GPU's backlog played forward as of ``now_ms``, as this mode weighs it."""
        return Timeline(self.costs, gpu, now_ms, reserve=self.mode.reserves)

    def adjust(
        self,
        task: Task,
        own: Timeline,
        lines: Sequence[Timeline],
        ready_ms: float,
        threshold: float = 1.5,
        *,
        inputs: Sequence[Input] = (),
        leave: bool = False,
    ) -> Timeline:
        """Re-place a ready task whose planned GPU would keep it waiting longer than
        ``threshold`` × its run time (``threshold`` 0: always take the GPU where it
        would start first). The GPUs are their timelines as of ``ready_ms``
        (``timeline``); ``own`` is the planned GPU's, without the task, and is
        returned when the task stays. A caller that keeps timelines up to date
        saves building one per GPU for every task it sends.

        The wait on the planned GPU is for what goes before the task there. Elsewhere
        the task is weighed as in ``plan``: when the GPU would take it (its inputs
        moved from the parents' nodes, ``inputs``), the model load and the eviction
        penalty; ``compass`` moves it only into gaps that delay nothing planned.
        Ties keep the planned GPU. ``leave``: the planned GPU refused the task, so
        the earliest start elsewhere wins, whatever the threshold (``own`` only when
        no other GPU may take it). The timelines are not changed.
        """
        # jit re-routes to the lowest wait plus load; compass weighs what it plans by:
        # input transfers, the load and the eviction penalty, reservations kept.
        aware = self.mode is not PlanMode.JIT
        own_ready = self.ready_at(task, own.node_id, ready_ms, inputs) if aware else ready_ms
        k = own.slot(own_ready)
        if (
            not leave
            and threshold
            and own.begin(k, own_ready) - own_ready <= threshold * task.run_ms
        ):
            return own
        insertion = self.mode is PlanMode.COMPASS

        def cost(line: Timeline, j: int) -> float:
            cache = line.cache(j)
            load = load_ms(self.costs, task, cache, line.memory_mb)
            return load + penalty_ms(self.costs, task, cache, line.memory_mb) if aware else load

        # The earliest start wins; ties keep the planned GPU, then go by the order.
        key = self.order.key
        if leave:
            best = (math.inf, False, key(own.gpu_id))
        else:
            best = (own.begin(k, own_ready) + cost(own, k), False, key(own.gpu_id))
        chosen = own
        others = [
            (self.ready_at(task, line.node_id, ready_ms, inputs) if aware else ready_ms, line)
            for line in lines
            if line is not own
        ]
        if insertion:  # the GPUs that may take it soonest first (see Timeline.earliest_begin)
            others.sort(key=lambda other: (other[1].earliest_begin(other[0]), key(other[1].gpu_id)))
        for ready, line in others:
            if insertion:
                bound = line.earliest_begin(ready)
                if bound > best[0] and task.run_ms > math.ulp(bound):
                    continue
            # A load and an eviction only add: a GPU that takes it later is not weighed.
            found = line.earliest(task, ready, insertion, best[0])
            if found is None:
                continue
            j, begin = found
            candidate = (begin + cost(line, j), True, key(line.gpu_id))
            if candidate < best:
                best, chosen = candidate, line
        return chosen

    def ready_at(
        self, task: Task, node_id: NodeId, ready_ms: float, inputs: Sequence[Input] = ()
    ) -> float:
        """When the task's inputs reach ``node_id``: ``ready_ms`` or, if later, when
        the last one arrives from where its parent ran (``inputs``)."""
        moved = (
            i.finish_ms + self.costs.transfer_ms(task.in_kb, i.node_id == node_id) for i in inputs
        )
        return max(ready_ms, max(moved, default=ready_ms))

    def wait_ms(self, gpu: GpuState, ready_ms: float) -> float:
        """How long a task ready at ``ready_ms`` would wait for ``gpu`` (before any load),
        behind what was sent there and what is planned to arrive before it."""
        return self.timeline(gpu, ready_ms).wait(ready_ms)

    def _arrivals(
        self,
        task: Task,
        done: dict[str, Assignment],
        node_of: dict[str, NodeId],
        now_ms: float,
    ) -> Arrivals:
        """When the task's inputs would reach each node, as planned (see Arrivals)."""
        moved = self.costs.transfer_ms(task.in_kb, same_node=False)
        local: dict[NodeId, float] = {}  # node -> when its last parent there ends
        for parent in task.parents:
            assignment = done[parent]
            node_id = node_of[assignment.gpu_id]
            local[node_id] = max(local.get(node_id, assignment.finish_ms), assignment.finish_ms)
        return Arrivals(now_ms, moved, local)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
