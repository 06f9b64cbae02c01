"""Preemption under way: when a round of planning is due, and the nodes being freed
for waiting jobs.

Planning scans the running work, so it runs in rounds: at most every
``PREEMPTION_ROUND_S`` of input time (ticks keep time moving), when the budget
changes, and when debug work arrives (the fast path). A plan (``preemption.py``)
stops its victims and reserves the nodes it frees for its job until the job is
placed there; a plan that failed is not searched for again until the running
work changes or a while passes.

When no plan frees room now, a charged (non-debug) job gets an *earmark* instead
(``earmarks.py``): the nodes that will have room for it soonest, with its estimated
start. Several blocked jobs may have nodes earmarked, one per allocation in rank
order; an earmark's nodes are chosen afresh every ``EARMARK_REFRESH_S`` (as work ends,
the soonest nodes move), and a round that plans for other jobs releases it. Earmarks
are kept until then, not timed out like nodes being freed. In between, a round checks
whether an earmark's nodes can be freed without loss, unless nothing that check read
has changed since it last failed and no contract (or turn on borrowed GPUs) there has
ended.

A round plans for up to a dozen jobs, each over every node, so a plan reads only the
nodes it may not skip at once (``_roomy``): those with a few free GPUs, and those the
room index (``rooms.RoomIndex``) says may have room, in the order ``plan_preemption``
stops early in. Nodes where free work may make room are searched first: a plan that
stops only free work losing nothing costs the least, and only they can have one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass

from libs.core.capacity import Capacity
from libs.core.config import PolicyConfig
from libs.core.contract import Reclaims, RunningJob, victims_of
from libs.core.earmarks import Earmark, Floors, floors, release_time, soonest_nodes
from libs.core.ids import JobId, NodeId
from libs.core.model import JobSpec, WorkClass
from libs.core.preemption import Plan, costs_least, plan_preemption
from libs.core.queues import Waiting
from libs.core.rooms import Room
from libs.core.running import RunningWork
from libs.core.state import Cell, State, Table

PREEMPTION_ROUND_S = 10.0
# Contracts expire and ranks drift with time: a failed plan is tried again after this.
NO_PLAN_RETRY_S = 60
# Victims normally end within their stop grace; a node that never reports back
# must not stay reserved forever.
RESERVATION_TIMEOUT_S = 600
# An earmark's nodes are chosen afresh this often (the soonest nodes move as work ends);
# in between, a round only checks whether they can be freed, a much cheaper question.
EARMARK_REFRESH_S = 900
# How long a job waits for room that costs no work (an earmark) before work that cannot
# resume is thrown away for it.
EARMARK_PATIENCE_S = 3600
# Earmarks' checks that failed, remembered (the oldest forgotten first) to skip the
# search while nothing it read changed: every round checks every earmark again.
FAILED_MEMO = 64

Candidates = list[tuple[NodeId, int, int]]  # (node id, GPU count, free GPUs)


@dataclass(frozen=True)
class _Failed:
    """A lossless plan that failed, with everything it read. A lossless plan stops only
    work that loses nothing, so it can only succeed later if what it read changes or a
    contract ends (``until``, the first end among its candidates' work after the plan):
    as time passes, work that cannot resume only loses more, so may only drop out."""

    spec: JobSpec
    candidates: Candidates
    victims: list[tuple[RunningJob, ...]]
    rank: dict[str, int]
    reclaims: Reclaims
    until: float


class Reservations:
    DERIVED = ("_earmarked",)

    def __init__(self, config: PolicyConfig, state: State) -> None:
        self.config = config
        # Node -> (the job it is being freed for, since); job -> the nodes freed for it.
        self.reserved: Table[NodeId, tuple[JobId, float]] = state.table("reserved")
        self.nominated: Table[JobId, tuple[NodeId, ...]] = state.table("nominated")
        # The last plan that failed: ((job id, running work's version), when).
        self._no_plan: Cell[tuple[tuple[JobId, int], float] | None] = state.cell("no_plan", None)
        # Jobs whose nodes are earmarked (not yet being freed) -> their estimated start.
        self.earmarks: Table[JobId, float] = state.table("earmarks")
        self._earmarked: set[NodeId] = set()  # their nodes (``derived`` rebuilds it)
        self._next_round_at = state.cell("next_preemption_at", 0.0)
        self._failed: dict[JobId, _Failed] = {}  # a memo keyed by all it read, not state
        # A memo, not state: each node's ``earmarks.Floors``, with the entries they were
        # read from (a new tuple as the node's work changes; an earmark reads every node).
        self._floors: dict[NodeId, tuple[tuple[Room, ...], Floors]] = {}
        # A memo, not state: the reserved nodes not earmarked, dropped as reservations change
        # (every pass asks, once per allocation, and a gang's earmark spans many nodes).
        self._open: frozenset[NodeId] | None = None

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
        *,
        reclaims: Reclaims,
    ) -> tuple[RunningJob, ...]:
        """Plan to free room for a blocked job: reserve the nodes and return the victims
        to stop; or, when none can give it room now, earmark the nodes that free soonest.
        ``reclaims``: whose borrowed GPUs it may take back (``contract.Reclaims``)."""
        if not job.spec.allocated:
            return ()
        spec, free, reserved = job.spec, capacity.free, self.reserved  # bound: a hot loop
        running_on = running.preemptible_by_node()
        marked = self.nominated.get(job.job_id) if job.job_id in self.earmarks else None
        if marked and now < reserved[marked[0]][1] + EARMARK_REFRESH_S:
            # Between refreshes an earmark only checks whether its own nodes can be freed.
            candidates = [(n, capacity.nodes[n].gpu_count, len(free(n))) for n in marked]
            room = running.room_bound(now, lossless=True)
            plan = self._lossless(job, candidates, running_on, room, rank, now, reclaims)
            return self._stop_for(job.job_id, plan, now)
        attempt = (job.job_id, running.version)
        no_plan = self._no_plan.value
        if no_plan is not None and no_plan[0] == attempt and now < no_plan[1] + NO_PLAN_RETRY_S:
            return ()
        self.release(job.job_id)  # an earmark is planned afresh
        nodes = capacity.schedulable(spec)
        node_size = _largest(nodes, reserved)
        # Room without throwing work away; else the soonest such room, earmarked; else, when
        # that is too far off, room at the cost of work that cannot resume.
        plan = self._plan(
            spec, nodes, node_size, capacity, running, rank, now, reclaims, lossless=True
        )
        if plan is not None:
            return self._stop_for(job.job_id, plan, now)
        earmark = None
        if spec.work_class is WorkClass.ALLOCATED:  # debug work is meant to start in seconds
            earmark = self._earmark(spec, nodes, running, rank, now, reclaims)
        if earmark is None or earmark.starts_at > now + EARMARK_PATIENCE_S:
            # A job throws away, in all, at most what it is sure to do itself (its
            # minimum runtime) or what it has waited, whichever is more, on its GPUs
            # (never past the contract cap): a short wide job is not stuck for good
            # behind work that started while it waited and that cannot resume.
            loss_cap_s = min(
                max(spec.min_runtime_s, now - job.since), self.config.max_min_runtime_s
            )
            plan = self._plan(
                spec,
                nodes,
                node_size,
                capacity,
                running,
                rank,
                now,
                reclaims,
                loss_cap_s=loss_cap_s,
            )
            if plan is not None:
                return self._stop_for(job.job_id, plan, now)
        self._no_plan.value = (attempt, now)
        if earmark is not None:
            self.earmarks[job.job_id] = max(earmark.starts_at, now)
            self._earmarked.update(earmark.node_ids)
            self._reserve(job.job_id, earmark.node_ids, now)
        return ()

    def _plan(
        self,
        spec: JobSpec,
        nodes: Mapping[NodeId, int],
        node_size: int,
        capacity: Capacity,
        running: RunningWork,
        rank: dict[str, int],
        now: float,
        reclaims: Reclaims,
        *,
        lossless: bool = False,
        loss_cap_s: float = math.inf,
    ) -> Plan | None:
        """``plan_preemption`` over ``nodes`` not reserved, reading only those it may not
        skip at once (``_roomy``). A plan that stops only free work losing nothing costs
        the least, and only nodes where free work may make room can have one: those are
        searched first, and when one has such a plan, no other node is weighed."""

        def search(candidates: Iterable[tuple[NodeId, int, int]]) -> Plan | None:
            return plan_preemption(
                spec,
                candidates,
                running.preemptible_by_node(),
                rank,
                now,
                lossless=lossless,
                loss_cap_s=loss_cap_s,
                room_bound=running.room_bound(now, lossless=lossless),
                node_size=node_size,
                ordered=True,
                reclaims=reclaims,
            )

        def roomy(free_work: bool) -> Iterator[tuple[NodeId, int, int]]:
            return _roomy(
                spec,
                nodes,
                node_size,
                self.reserved,
                capacity,
                running,
                now,
                lossless=lossless,
                free_work=free_work,
            )

        if spec.parts > 1:  # a part on each of several nodes: every node not reserved
            free = capacity.free
            return search(
                (n, size, len(free(n))) for n, size in nodes.items() if n not in self.reserved
            )
        if spec.gpus <= node_size:  # a gang's plan weighs its nodes together
            plan = search(roomy(free_work=True))
            if plan is not None and costs_least(plan, now):
                return plan
        return search(roomy(free_work=False))

    def _earmark(
        self,
        spec: JobSpec,
        nodes: Mapping[NodeId, int],
        running: RunningWork,
        rank: dict[str, int],
        now: float,
        reclaims: Reclaims,
    ) -> Earmark | None:
        """The nodes not reserved to earmark for ``spec``, as ``earmarks.soonest_nodes`` picks
        them: GPUs not held by running work (free, or being freed) count as free now."""
        # Losslessly: ``release_time`` checks.
        may_take_now = victims_of(spec, rank, now, reclaims=reclaims)
        may_take_later = victims_of(spec, rank, math.inf, reclaims=reclaims)
        running_on = running.preemptible_by_node()
        reserved, memo, rooms_of = self.reserved, self._floors, running.rooms
        candidates: list[tuple[NodeId, int, int, Floors]] = []
        for node_id, size in nodes.items():
            if node_id in reserved:
                continue
            rooms = rooms_of(node_id)
            known = memo.get(node_id)
            if known is None or known[0] is not rooms:
                known = memo[node_id] = (rooms, floors(rooms))
            candidates.append((node_id, size, size - len(known[1][1]), known[1]))

        def releases(node_id: NodeId) -> list[tuple[float, int]]:
            return [
                (release_time(v, may_take_now, may_take_later, now), v.gpus)
                for v in running_on.get(node_id, ())
            ]

        return soonest_nodes(spec, candidates, releases, now)

    def _lossless(
        self,
        job: Waiting,
        candidates: Candidates,
        running_on: Mapping[NodeId, Iterable[RunningJob]],
        room: Callable[[NodeId], int],
        rank: dict[str, int],
        now: float,
        reclaims: Reclaims,
    ) -> Plan | None:
        """``plan_preemption`` losing nothing, skipped while it is sure to fail again."""
        victims = [tuple(running_on.get(node_id, ())) for node_id, _, _ in candidates]
        failed = self._failed.get(job.job_id)
        if (
            failed is not None
            and now < failed.until
            and failed.spec is job.spec
            and failed.candidates == candidates
            and failed.victims == victims  # the same objects: compared by identity first
            and failed.rank == rank
            and failed.reclaims == reclaims
        ):
            return None
        plan = plan_preemption(
            job.spec,
            candidates,
            running_on,
            rank,
            now,
            lossless=True,
            room_bound=room,
            reclaims=reclaims,
        )
        self._failed.pop(job.job_id, None)
        if plan is None:
            until = min(  # the first contract (or turn on borrowed GPUs) to end
                (
                    t
                    for on in victims
                    for v in on
                    for t in (v.protected_until, v.borrowed_until)
                    if t > now
                ),
                default=math.inf,
            )
            self._failed[job.job_id] = _Failed(
                job.spec, candidates, victims, dict(rank), reclaims, until
            )
            if len(self._failed) > FAILED_MEMO:
                del self._failed[next(iter(self._failed))]
        return plan

    def _stop_for(self, job_id: JobId, plan: Plan | None, now: float) -> tuple[RunningJob, ...]:
        """Reserve a plan's nodes for the job: its victims are to be stopped."""
        if plan is None:
            return ()
        self.release(job_id)
        self._reserve(job_id, plan.node_ids, now)
        return plan.victims

    def keep_earmarks(self, planned: set[JobId]) -> None:
        """A round planned for ``planned``: earmarks for any other job are released (it
        was placed elsewhere, or others now rank before it)."""
        for job_id in sorted(self.earmarks):
            if job_id not in planned:
                self.release(job_id)

    def _reserve(self, job_id: JobId, node_ids: tuple[NodeId, ...], now: float) -> None:
        for node_id in node_ids:
            self.reserved[node_id] = (job_id, now)
        self.nominated[job_id] = node_ids
        self._open = None

    def earmarked(self) -> set[NodeId]:
        """The nodes earmarked for a job, not being freed: work that cannot delay it may run
        there meanwhile (read it before reservations change)."""
        return self._earmarked

    def open_nodes(self) -> frozenset[NodeId]:
        """The reserved nodes not earmarked: those being freed for a job, where nothing else
        may start; a snapshot, which a change to reservations replaces."""
        if self._open is None:
            self._open = frozenset(self.reserved.keys() - self._earmarked)
        return self._open

    def derived(self) -> dict[str, object]:
        """The index (``DERIVED``) rebuilt from the tables alone."""
        marked = {node for node, (job, _) in self.reserved.items() if job in self.earmarks}
        return {"_earmarked": marked}

    def blocked_for(self, job_id: JobId) -> set[NodeId]:
        """The nodes reserved for other jobs."""
        return {node for node, (holder, _) in self.reserved.items() if holder != job_id}

    def release(self, job_id: JobId) -> None:
        """The job no longer waits for its nodes (placed, cancelled, or given up on)."""
        marked = self.earmarks.pop(job_id) is not None
        for node in self.nominated.pop(job_id) or ():
            del self.reserved[node]
            self._open = None
            if marked:
                self._earmarked.discard(node)

    def release_node(self, node_id: NodeId) -> None:
        """The node is gone: the job it was reserved for plans again."""
        for reserved, (job_id, _) in sorted(self.reserved.items()):
            if reserved == node_id:
                self.release(job_id)

    def expire(self, now: float) -> None:
        limit = now - RESERVATION_TIMEOUT_S
        expired = [
            (node, job_id)
            for node, (job_id, since) in self.reserved.items()
            if since < limit and job_id not in self.earmarks
        ]  # sorted only when any is: every pass asks, and gangs reserve many nodes
        for _node, job_id in sorted(expired):
            self.release(job_id)


def _largest(nodes: Mapping[NodeId, int], reserved: Container[NodeId]) -> int:
    """The most GPUs of a node not reserved (most nodes have the most: found at once)."""
    most = max(nodes.values(), default=0)
    if any(size == most and node_id not in reserved for node_id, size in nodes.items()):
        return most
    return max((size for node_id, size in nodes.items() if node_id not in reserved), default=0)


def _roomy(
    spec: JobSpec,
    nodes: Mapping[NodeId, int],
    node_size: int,
    reserved: Container[NodeId],
    capacity: Capacity,
    running: RunningWork,
    now: float,
    *,
    lossless: bool,
    free_work: bool,
) -> Iterator[tuple[NodeId, int, int]]:
    """Of ``nodes`` not reserved, those a plan does not skip at once, as ``plan_preemption``
    reads them ``ordered``: where free GPUs plus ``room_bound`` may hold the job (or a
    whole node, for a gang). Nodes with a few GPUs free are few, and come first; the rest
    need all the room from the bound, which few nodes of a full cluster may give (or,
    ``free_work``, from free work's bound: the others need charged work stopped)."""
    gang = spec.gpus > node_size
    need = node_size if gang else spec.gpus
    free = capacity.free
    partly = sorted(
        (-len(free(n)), n) for n in capacity.partly_free(spec, need if gang else need - 1)
    )
    for count, node_id in partly:
        if node_id not in reserved:
            yield node_id, nodes[node_id], -count
    roomy = set(running.roomy(now, need, lossless=lossless, free_work=free_work))
    roomy.difference_update(n for _, n in partly)
    # In id order: from the few such nodes, or else from all (a plan may stop early).
    ids = sorted(roomy) if len(roomy) * 8 < len(nodes) else nodes
    for node_id in ids:
        if node_id in roomy and node_id in nodes and node_id not in reserved:
            yield node_id, nodes[node_id], len(free(node_id))
