"""Preemption under way: when a round of planning is due, and the nodes being freed
for waiting jobs.

Planning scans the running work, so it runs in rounds: at most every
``PREEMPTION_ROUND_S`` of input time (ticks keep time moving), when the budget
changes, and when debug work arrives (the fast path). A plan (``preemption.py``)
stops its victims and reserves the nodes it frees for its job until the job is
placed there; a plan that failed is not searched for again until the running
work changes or a while passes.
"""

from __future__ import annotations

from libs.core.capacity import Capacity
from libs.core.contract import RunningJob
from libs.core.ids import JobId, NodeId
from libs.core.preemption import plan_preemption
from libs.core.queues import Waiting
from libs.core.running import RunningWork
from libs.core.state import Cell, State, Table

PREEMPTION_ROUND_S = 10.0
# Contracts expire and ranks drift with time: a failed plan is tried again after this.
NO_PLAN_RETRY_S = 60
# Victims normally end within their stop grace; a node that never reports back
# must not stay reserved forever.
RESERVATION_TIMEOUT_S = 600


class Reservations:
    def __init__(self, state: State) -> None:
        # Node -> (the job it is being freed for, since); job -> the nodes freed for it.
        self.reserved: Table[NodeId, tuple[JobId, float]] = state.table("reserved")
        self.nominated: Table[JobId, tuple[NodeId, ...]] = state.table("nominated")
        # The last plan that failed: ((job id, running work's version), when).
        self._no_plan: Cell[tuple[tuple[JobId, int], float] | None] = state.cell("no_plan", None)
        self._next_round_at = state.cell("next_preemption_at", 0.0)

    def round_due(self, now: float, *, fast: bool, budget_changed: bool) -> bool:
        """Whether this input's pass may plan preemption; the fast path (debug work
        arriving) does not move the next round."""
        due = fast or budget_changed or now >= self._next_round_at.value
        if due and not fast:
            self._next_round_at.value = now + PREEMPTION_ROUND_S
        return due

    def plan_for(
        self,
        job: Waiting,
        capacity: Capacity,
        running: RunningWork,
        rank: dict[str, int],
        now: float,
    ) -> tuple[RunningJob, ...]:
        """Plan to free room for a blocked job: reserve the nodes and return the victims
        to stop (none when no plan frees room)."""
        if not job.spec.allocated:
            return ()
        attempt = (job.job_id, running.version)
        no_plan = self._no_plan.value
        if no_plan is not None and no_plan[0] == attempt and now < no_plan[1] + NO_PLAN_RETRY_S:
            return ()
        spec, free, reserved = job.spec, capacity.free, self.reserved  # bound: a hot loop
        candidates = [
            (node_id, node.gpu_count, len(free(node_id)))
            for node_id, node in sorted(capacity.nodes.items())
            if node_id not in reserved
            and (not spec.gpu_type or node.gpu_type == spec.gpu_type)
            and node.gpu_memory_gib >= spec.min_gpu_memory_gib
        ]
        plan = plan_preemption(spec, candidates, running.preemptible_by_node(), rank, now)
        if plan is None:
            self._no_plan.value = (attempt, now)
            return ()
        for node_id in plan.node_ids:
            self.reserved[node_id] = (job.job_id, now)
        self.nominated[job.job_id] = plan.node_ids
        return plan.victims

    def blocked_for(self, job_id: JobId) -> set[NodeId]:
        """The nodes reserved for other jobs."""
        return {node for node, (holder, _) in self.reserved.items() if holder != job_id}

    def release(self, job_id: JobId) -> None:
        """The job no longer waits for its nodes (placed, cancelled, or given up on)."""
        for node in self.nominated.pop(job_id) or ():
            del self.reserved[node]

    def release_node(self, node_id: NodeId) -> None:
        """The node is gone: the job it was reserved for plans again."""
        for held, (job_id, _) in sorted(self.reserved.items()):
            if held == node_id:
                self.release(job_id)

    def expire(self, now: float) -> None:
        limit = now - RESERVATION_TIMEOUT_S
        for _node, (job_id, since) in sorted(self.reserved.items()):
            if since < limit:
                self.release(job_id)
