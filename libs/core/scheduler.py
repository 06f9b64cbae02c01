"""The budget scheduler: a deterministic state machine driven by its input log.

``handle`` folds one input into the state and returns the decisions it causes.
The placement service, the simulator and the audit replayer all drive this
class, so the same inputs always yield the same decisions and digests.
Iteration follows insertion order (the input order) or sorted keys, never
hash order; time comes only from the inputs.

A scheduling pass, in order:
  1. rank allocations by fair share (usage ÷ entitlement, level by level);
  2. walk the tiers: debug work (the fast path), allocated work, free work;
  3. in each tier, walk allocations in rank order and their jobs in queue
     order, placing every job that fits (best fit, gangs all or nothing);
  4. the first job of a tier that does not fit may preempt: free work first,
     then past-contract work of allocations ranked below its own; the node it
     frees is reserved for it;
  5. jobs that still wait get a reason when their reason changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from libs.core.budget_tree import BudgetTree
from libs.core.capacity import Capacity, Fit, NoFit, describe
from libs.core.compass.scheduler import GpuKey, Serving
from libs.core.config import PolicyConfig
from libs.core.contract import RunningJob
from libs.core.decisions import (
    Cancel,
    Decision,
    JobLost,
    NodeLost,
    Place,
    Preempted,
    Refused,
    Requeue,
    Stop,
    StopCause,
    TaskLost,
    Wait,
)
from libs.core.explain import Explanation, explain_running, explain_serving, explain_waiting
from libs.core.fairshare import Standing, leaf_order, standings
from libs.core.ids import batch_task_id
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    ModelEvicted,
    ModelLoaded,
    NodeHeartbeat,
    NodeJoined,
    TaskEnded,
    TaskIdle,
    TaskStarted,
    UsageSnapshot,
)
from libs.core.model import JobSpec, NodeSpec, WorkClass
from libs.core.preemption import plan_preemption
from libs.core.queues import TIERS, Queues, Waiting
from libs.core.state import Cell, State, Table
from libs.core.validation import joined, rejection, validate_node

POLICY = "budget"
# 9: every decision's provenance carries the digest of the knobs it was decided
# under (``config_digest``), so the same input yields other bytes than under 8.
# 10: the digest covers every declared table (libs/core/state.py): reasons, seen jobs,
# the no-plan cache, the preemption round and more; the decisions are unchanged.
POLICY_VERSION = 10
PREEMPTION_ROUND_S = 10.0
DEBUG_PLANS = 8  # debug jobs a pass may preempt for


@dataclass(frozen=True)
class _Running:
    job_id: str
    spec: JobSpec
    seq: int
    attempt: int
    placed_at: float
    tasks: dict[str, tuple[str, tuple[int, ...]]]  # task id -> (node id, GPU indices); kept
    started_at: float | None = None
    idle: bool = False
    stopping: StopCause | None = None
    ended: tuple[str, ...] = ()  # sorted
    lost: str = ""  # why its node was lost, when it was

    def but(self, **changes: object) -> _Running:
        """A copy with ``changes``: ``dataclasses.replace`` without its cost (a few µs,
        on every task start and end), as the class has no ``__post_init__``."""
        run = object.__new__(_Running)
        run.__dict__.update(self.__dict__, **changes)
        return run

    def fact(self) -> str:
        """Every field, for the state digest (the job id is the table's key)."""
        return (
            f"{self.seq}|{self.attempt}|{self.placed_at}|{self.tasks}|{self.started_at}"
            f"|{self.idle}|{self.stopping}|{self.ended}|{self.lost}|{self.spec.fact}"
        )


class _Snapshot(NamedTuple):
    at: float
    usage: dict[str, float]  # charged GPU-seconds per allocation; never changed in place


class _Lender:
    """Serving's narrow view of the batch capacity (``serving.BatchGpus``): it takes
    free GPUs and gives them back, never on nodes reserved for a preempting job."""

    def __init__(self, capacity: Capacity, reserved: Table[str, tuple[str, float]]) -> None:
        self._capacity = capacity
        self._reserved = reserved

    @property
    def total_gpus(self) -> int:
        return self._capacity.total_gpus

    @property
    def total_free(self) -> int:
        return self._capacity.total_free

    def node(self, node_id: str) -> NodeSpec | None:
        return self._capacity.nodes.get(node_id)

    def free_gpus(self) -> Iterator[GpuKey]:
        for node_id in self._capacity.nodes:
            if node_id not in self._reserved:
                for index in self._capacity.free(node_id):
                    yield node_id, index

    def take(self, key: GpuKey) -> None:
        self._capacity.take(key[0], (key[1],))

    def give(self, key: GpuKey) -> None:
        self._capacity.give(key[0], (key[1],))


class Scheduler:
    """The state machine. What it remembers is declared in ``self._state`` (tables
    and cells the digest covers by construction); every other attribute is the
    config, the input clock, or a cache derived from declared state (named in
    ``DERIVED``, rebuilt by ``derived``)."""

    DERIVED = ("_on_node", "_entitlements", "_free_work_gpus")

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.now = 0.0  # the input clock: the largest ``at`` of the log so far
        state = self._state = State()
        self._capacity = Capacity(state)
        self._queues = Queues(state)
        self._running: Table[str, _Running] = state.table("running", _Running.fact)
        self._tree: Cell[BudgetTree | None] = state.cell("tree", None, _tree_fact)
        self._snapshot = state.cell("usage", _Snapshot(0.0, {}), _snapshot_fact)
        # Preemption: node -> (the job it is freed for, since); job -> its reserved nodes.
        self._reserved: Table[str, tuple[str, float]] = state.table("reserved")
        self._nominated: Table[str, tuple[str, ...]] = state.table("nominated")
        self._reasons: Table[str, str] = state.table("reasons")  # the last Wait each job heard
        self._seen: Table[str, None] = state.table("seen")  # every job id decided on
        self._seq = state.cell("seq", 0)  # submission order
        self._running_version = state.cell("running_version", 0)  # bumped as running work changes
        # A failed preemption plan: ((job id, running_version), when).
        self._no_plan: Cell[tuple[tuple[str, int], float] | None] = state.cell("no_plan", None)
        self._next_preemption_at = state.cell("next_preemption_at", 0.0)
        # Per allocation: allocated running GPUs (priced), and the sum of gpus × max(placed,
        # snapshot time): usage since the snapshot in O(allocations). Float sums depend
        # on the order of the terms, so they are state, not a cache.
        self._tally: Table[str, tuple[float, float]] = state.table("tally")
        self._impossible: Table[str, None] = state.table("impossible")  # no node can ever hold
        # Liveness: the agent incarnation each node registered with last, and when the
        # nodes that heartbeat were last heard from (input time, oldest first).
        self._incarnations: Table[str, str] = state.table("incarnations")
        self._leases: Table[str, float] = state.table("leases")
        # Derived caches (see ``derived``).
        self._on_node: dict[str, dict[str, None]] = {}  # node -> running job ids (ordered set)
        self._entitlements: dict[str, float] = {}  # of the tree
        self._free_work_gpus = 0  # GPUs held by running free work: debug work's headroom
        # Workflows (DAGs of model-serving tasks) are planned by the serving core, in
        # tables of its own, on GPUs it borrows from this scheduler's capacity.
        self._serving = Serving(self.config, state, _Lender(self._capacity, self._reserved))

    # -- the one entry point -------------------------------------------------

    def handle(self, event: Input) -> list[Decision]:
        """Fold one input; never raises: an input it cannot act on is answered with a
        ``Reject`` (a job) or a ``Refused`` (anything else), and changes nothing."""
        decisions = self._handle(event)
        self._state.settle()  # hashes what the input changed, once per fact
        return decisions

    def _handle(self, event: Input) -> list[Decision]:
        gap = event.at - self.now
        if self._leases and gap > self.config.node_lost_timeout_s / 2:
            # The log itself was silent (the broker, or everything that writes to it,
            # was down; the ticker writes every second): nobody could heartbeat, so
            # that silence is held against no node, instead of losing them all at once.
            for node_id, heard in list(self._leases.items()):
                self._leases[node_id] = heard + gap
        self.now = max(self.now, event.at)
        decisions: list[Decision] = []
        match event:
            case JobArrived():
                if event.job_id in self._seen:  # a duplicate submission: already decided
                    return []
                self._seen[event.job_id] = None
                rejected = rejection(event.job_id, event.spec)
                if rejected is not None:
                    return [rejected]
                if event.spec.workflow is not None:
                    decisions += self._serving.arrive(event.job_id, event.spec, self._now_ms)
                else:
                    self._seq.value += 1
                    self._enqueue(Waiting(event.job_id, event.spec, self._seq.value, 0, event.at))
            case NodeJoined():
                if violations := validate_node(event.node):
                    return [Refused(event.node.node_id, joined(violations))]
                decisions += self._register(event)
                decisions += self._recheck_impossible()
            case NodeHeartbeat():
                self._heard(event)
                lost = self._expire_leases()
                if not lost:
                    return []  # only time passed: the next tick's pass sees it
                decisions += lost
            case TaskStarted() if self._serving.owns(event.task_id, event.node_id):
                self._serving.started(event.task_id, self._now_ms)
            case TaskStarted():
                self._started(event)
            case TaskEnded() if self._serving.owns(event.task_id, event.node_id):
                decisions += self._serving.ended(event.task_id, event.exit_code, self._now_ms)
            case TaskEnded():
                decisions += self._ended(event.job_id, event.task_id, event.node_id, event.at)
            case ModelLoaded():
                self._serving.loaded(event.node_id, event.gpu_index, event.model, event.size_mb)
            case ModelEvicted():
                self._serving.evicted(event.node_id, event.gpu_index, event.model)
            case TaskIdle():
                self._update(event.job_id, idle=event.idle, task_id=event.task_id)
            case CancelRequested():
                served = self._serving.cancel(event.job_id, self._now_ms)
                decisions += self._cancel(event.job_id) if served is None else served
            case BudgetSet():
                self._set_tree(event.tree)
                self._running_version.value += 1  # ranks changed
            case UsageSnapshot() if not all(math.isfinite(u) for _, u in event.usage):
                return [Refused("usage snapshot", "charged GPU-seconds must be finite numbers")]
            case UsageSnapshot():
                self._snapshot.value = _Snapshot(event.at, dict(event.usage))
                self._reweigh()
        decisions += self._expire_leases()
        # Preemption planning scans the running work, so it runs in rounds: at
        # most every 10 s of input time (ticks keep time moving), when the budget
        # changes, and when debug work arrives (the fast path).
        fast = isinstance(event, JobArrived) and event.spec.work_class is WorkClass.DEBUG
        preempt = fast or isinstance(event, BudgetSet) or self.now >= self._next_preemption_at.value
        if preempt and not fast:
            self._next_preemption_at.value = self.now + PREEMPTION_ROUND_S
        self._serving.release_idle(self._now_ms)
        # Workflows take freed GPUs before any batch tier: the fast path.
        self._serving.grow(self._now_ms)
        if self._serving.waiting:
            decisions += self._serving.retry(self._now_ms)
        decisions += self._schedule(preempt)
        if isinstance(event, JobArrived) and event.job_id not in self._reasons:
            # Every new job hears why it waits, even when the pass stopped early.
            waiting = self._queues.jobs.get(event.job_id)
            if waiting is not None:
                decisions += self._wait(waiting)
        return [self._addressed(d) for d in decisions]

    def _addressed(self, decision: Decision) -> Decision:
        """A placement names the agent incarnation it is for (see ``Place``)."""
        if isinstance(decision, Place):
            incarnation = self._incarnations.get(decision.node_id, "")
            if incarnation:
                return replace(decision, node_incarnation=incarnation)
        return decision

    def serving_gpus(self) -> int:
        """GPUs held for workflows now (taken from batch work)."""
        return len(self._serving.pool)

    def digest(self) -> bytes:
        """A fingerprint of the whole declared state, recorded with every decision."""
        return self._state.digest()

    def recomputed_digest(self) -> bytes:
        """The digest hashed afresh from every declared fact (for tests: slow)."""
        return self._state.recomputed()

    def derived(self) -> dict[str, object]:
        """The derived caches (``DERIVED``) rebuilt from declared state alone."""
        on_node: dict[str, dict[str, None]] = {}
        for job_id, run in self._running.items():
            for task_id, (node_id, _) in run.tasks.items():
                if task_id not in run.ended:
                    on_node.setdefault(node_id, {})[job_id] = None
        tree = self._tree.value
        return {
            "_on_node": on_node,
            "_entitlements": {} if tree is None else tree.entitlements(),
            "_free_work_gpus": sum(
                run.spec.gpus for run in self._running.values() if not run.spec.allocated
            ),
        }

    def explain(self, job_id: str) -> Explanation | None:
        """Why a job waits (or where it runs), computed from the current state."""
        rank = self._rank()
        standing = self._standings().get
        serving = self._serving.describe(job_id)
        if serving is not None:
            allocation = self._serving.allocation_of(job_id)
            waiting = job_id in self._serving.waiting
            return explain_serving(job_id, allocation, standing(allocation), serving, waiting)
        job = self._queues.jobs.get(job_id)
        if job is not None:
            fit = self._capacity.fit(job.spec, self._blocked_for(job_id))
            return explain_waiting(
                job,
                standing(job.spec.allocation),
                reason=fit.reason if not isinstance(fit, Fit) else "fits now: next in line",
                ahead=self._queues.ahead_of(job, rank),
                reserved=self._nominated.get(job_id),
            )
        run = self._running.get(job_id)
        if run is not None:
            return explain_running(
                job_id,
                run.spec.allocation,
                standing(run.spec.allocation),
                nodes=sorted({node for node, _ in run.tasks.values()}),
                protected_until=self._protected_until(run),
                now=self.now,
                stopping=run.stopping,
            )
        return None

    # -- folding inputs ------------------------------------------------------

    @property
    def _now_ms(self) -> float:
        return self.now * 1000

    def _enqueue(self, job: Waiting) -> None:
        self._queues.push(job)

    def _dequeue(self, job_id: str) -> Waiting | None:
        job = self._queues.remove(job_id)
        if job is not None:
            self._reasons.pop(job_id)
            self._impossible.pop(job_id)
            self._release(job_id)
        return job

    def _join(self, node: NodeSpec) -> None:
        old = self._capacity.nodes.get(node.node_id)
        if old == node:
            return
        held = self._serving.held_on(node.node_id) | {
            gpu
            for job_id in self._on_node.get(node.node_id, {})
            for task_node, gpus in self._running[job_id].tasks.values()
            if task_node == node.node_id
            for gpu in gpus
        }
        self._capacity.add(node, held)

    def _set_tree(self, tree: BudgetTree) -> None:
        self._tree.value = tree
        self._entitlements = tree.entitlements()

    def _started(self, event: TaskStarted) -> None:
        run = self._running.get(event.job_id)
        if run is not None and event.task_id in run.tasks and run.started_at is None:
            self._update(event.job_id, started_at=event.at)

    def _update(self, job_id: str, *, task_id: str = "", **changes: object) -> None:
        run = self._running.get(job_id)
        if run is None or (task_id and task_id not in run.tasks):
            return
        self._running[job_id] = run.but(**changes)
        self._running_version.value += 1

    def _ended(self, job_id: str, task_id: str, node_id: str, at: float) -> list[Decision]:
        """A task ended; a report from another node than the task's is not believed."""
        run = self._running.get(job_id)
        if run is None or run.tasks.get(task_id, ("",))[0] != node_id or task_id in run.ended:
            return []
        run = run.but(ended=tuple(sorted((*run.ended, task_id))))
        self._running[job_id] = run
        self._running_version.value += 1
        gpus = run.tasks[task_id][1]
        self._capacity.give(node_id, gpus)
        self._on_node.get(node_id, {}).pop(job_id, None)
        if len(run.ended) < len(run.tasks):  # the rest of its gang still runs
            return []
        del self._running[job_id]
        self._count(run, -1)
        if not run.spec.allocated:
            self._free_work_gpus -= run.spec.gpus
        if run.stopping is StopCause.PREEMPTED:
            what = "preempted"
        elif run.stopping is StopCause.NODE_LOST:
            what = run.lost
        else:
            return []
        if run.spec.resumable:
            self._enqueue(Waiting(run.job_id, run.spec, run.seq, run.attempt + 1, at))
            return [Requeue(run.job_id, f"{what}; requeued (resumable)")]
        if run.stopping is StopCause.PREEMPTED:
            return [Preempted(run.job_id, f"{what}; not resumable")]
        return [JobLost(run.job_id, f"{what}; not resumable")]

    # -- liveness --------------------------------------------------------------

    def _register(self, event: NodeJoined) -> list[Decision]:
        """A node (re)registered. Another incarnation means its agent restarted and
        killed what it ran: those tasks are lost, and its GPUs come back free."""
        node_id = event.node.node_id
        known = self._incarnations.get(node_id)
        decisions: list[Decision] = []
        if event.incarnation and known is not None and known != event.incarnation:
            restarted = f"the node agent on {node_id} restarted"
            decisions += self._lose_tasks(node_id, restarted)
            decisions += self._serving.lose(node_id, restarted, self._now_ms)
        self._incarnations[node_id] = event.incarnation
        self._lease(node_id, event.heartbeat_s > 0)
        self._join(event.node)
        self._serving.add_node(event.node)
        return decisions

    def _heard(self, event: NodeHeartbeat) -> None:
        node_id = event.node_id
        if node_id in self._leases and self._incarnations.get(node_id) == event.incarnation:
            self._lease(node_id, True)

    def _lease(self, node_id: str, held: bool) -> None:
        """Renew (``held``) or drop a node's lease; renewing moves it to the back."""
        self._leases.pop(node_id)
        if held:
            self._leases[node_id] = self.now

    def _expire_leases(self) -> list[Decision]:
        """Declare lost the nodes silent for longer than the timeout, oldest first."""
        timeout = self.config.node_lost_timeout_s
        decisions: list[Decision] = []
        while self._leases:
            node_id, heard = self._leases.first()
            if self.now - heard <= timeout:
                break
            silent = f"no heartbeat for {self.now - heard:.0f} s (node_lost_timeout_s {timeout:g})"
            decisions += self._lose_node(node_id, silent)
        return decisions

    def _lose_node(self, node_id: str, why: str) -> list[Decision]:
        self._lease(node_id, False)
        decisions: list[Decision] = [NodeLost(node_id, self._incarnations.get(node_id, ""), why)]
        decisions += self._lose_tasks(node_id, f"node {node_id} lost: {why}")
        decisions += self._serving.lose(node_id, f"node {node_id} lost: {why}", self._now_ms)
        self._capacity.remove(node_id)
        for held, (job_id, _) in sorted(self._reserved.items()):
            if held == node_id:
                self._release(job_id)
        return decisions

    def _lose_tasks(self, node_id: str, why: str) -> list[Decision]:
        """End every task on the node as lost; a gang's tasks elsewhere are stopped."""
        decisions: list[Decision] = []
        for job_id in list(self._on_node.get(node_id, {})):
            run = self._running[job_id]
            if run.stopping is None:
                self._update(job_id, stopping=StopCause.NODE_LOST, lost=why)
                decisions += [
                    Stop(job_id, task_id, other, StopCause.NODE_LOST, why)
                    for task_id, (other, _) in sorted(run.tasks.items())
                    if other != node_id and task_id not in run.ended
                ]
            for task_id, (task_node, _) in sorted(run.tasks.items()):
                if task_node == node_id and task_id not in run.ended:
                    decisions.append(TaskLost(job_id, task_id, node_id, why))
                    decisions += self._ended(job_id, task_id, node_id, self.now)
        return decisions

    def _cancel(self, job_id: str) -> list[Decision]:
        if self._dequeue(job_id) is not None:
            return [Cancel(job_id, "cancelled before it started")]
        run = self._running.get(job_id)
        if run is not None and run.stopping is None:
            return self._stop(run, StopCause.CANCELLED, "cancelled by user")
        return []

    def _stop(self, run: _Running, cause: StopCause, reason: str) -> list[Decision]:
        self._update(run.job_id, stopping=cause)
        return [
            Stop(run.job_id, task_id, node_id, cause, reason)
            for task_id, (node_id, _) in sorted(run.tasks.items())
            if task_id not in run.ended
        ]

    # -- the scheduling pass -------------------------------------------------

    def _schedule(self, preempt: bool) -> list[Decision]:
        if not self._queues:
            return []
        self._expire_reservations()
        rank = self._rank()
        decisions: list[Decision] = []
        # Jobs that preempted for room go first, on the node freed for them.
        for job_id in sorted(self._nominated):
            job = self._queues.jobs[job_id]
            fit = self._capacity.fit(job.spec, self._blocked_for(job_id))
            if isinstance(fit, Fit):
                decisions += self._place(job, fit)
        # Shapes (type, memory, GPUs) that did not fit: capacity only shrinks
        # during a pass, so jobs of the same shape need not be tried again.
        failed: set[tuple[str, float, int]] = set()
        for tier in TIERS:
            # Planning scans the running work, so a pass plans for few jobs: the
            # best-ranked blocked allocated job, and a handful of debug jobs (small,
            # short, and meant to start within seconds).
            tries = 0
            if preempt and tier is not WorkClass.UNALLOCATED:
                tries = DEBUG_PLANS if tier is WorkClass.DEBUG else 1
            for allocation in sorted(
                self._queues.allocations(tier), key=lambda a: (rank.get(a, len(rank)), a)
            ):
                decisions += self._place_allocation(tier, allocation, failed)
                head = self._queues.head(tier, allocation)
                if head is None:
                    continue
                blocked = (
                    self._queues.in_order(tier, allocation, tries)
                    if tier is WorkClass.DEBUG
                    else [head]
                )
                for job in blocked:
                    if tries and job.job_id not in self._nominated:
                        tries -= 1
                        decisions += self._preempt_for(job, rank)
                if head.job_id not in self._reasons or head.job_id in self._nominated:
                    decisions += self._wait(head)
        if self._capacity.total_free and not self._queues.allocations(WorkClass.UNALLOCATED):
            # The debug headroom is kept free for free work to fill; with none
            # waiting, idle GPUs would help nobody, so allocated work may take them.
            for allocation in sorted(
                self._queues.allocations(WorkClass.ALLOCATED),
                key=lambda a: (rank.get(a, len(rank)), a),
            ):
                decisions += self._place_allocation(
                    WorkClass.ALLOCATED, allocation, failed, headroom=False
                )
        return decisions

    def _place_allocation(
        self,
        tier: WorkClass,
        allocation: str,
        failed: set[tuple[str, float, int]],
        *,
        headroom: bool = True,
    ) -> list[Decision]:
        decisions: list[Decision] = []
        capacity = self._capacity
        if capacity.total_free == 0:
            return decisions
        reserved = self._reserved.keys()  # nominated jobs were placed before this
        largest, node_size, whole = capacity.shape(reserved)

        def could_fit(gpus: int) -> bool:
            # A gang spans whole free nodes; anything else needs one free block.
            return gpus <= largest or node_size < gpus <= whole

        for job in self._queues.candidates(tier, allocation, could_fit):
            if (
                headroom
                and tier is WorkClass.ALLOCATED
                and not self._leaves_headroom(job.spec.gpus)
            ):
                break
            shape = (job.spec.gpu_type, job.spec.min_gpu_memory_gib, job.spec.gpus)
            if shape in failed:
                continue
            fit = capacity.fit(job.spec, reserved)
            if isinstance(fit, Fit):
                decisions += self._place(job, fit)
                if capacity.total_free == 0:
                    break
                largest, node_size, whole = capacity.shape(reserved)
            else:
                failed.add(shape)
                decisions += self._wait(job, fit)
        return decisions

    def _leaves_headroom(self, gpus: int) -> bool:
        headroom = int(self.config.debug_headroom * self._capacity.total_gpus)
        return self._capacity.total_free - gpus + self._free_work_gpus >= headroom

    def _place(self, job: Waiting, fit: Fit) -> list[Decision]:
        self._dequeue(job.job_id)
        tasks: dict[str, tuple[str, tuple[int, ...]]] = {}
        decisions: list[Decision] = []
        for rank, (node_id, gpus) in enumerate(fit.tasks):
            task_id = batch_task_id(job.job_id, job.attempt, rank if len(fit.tasks) > 1 else None)
            tasks[task_id] = (node_id, gpus)
            self._capacity.take(node_id, gpus)
            self._on_node.setdefault(node_id, {})[job.job_id] = None
            decisions.append(Place(job.job_id, task_id, node_id, gpus, job.spec))
        run = _Running(job.job_id, job.spec, job.seq, job.attempt, self.now, tasks)
        self._running[job.job_id] = run
        self._count(run, +1)
        if not job.spec.allocated:
            self._free_work_gpus += job.spec.gpus
        self._running_version.value += 1
        return decisions

    def _wait(self, job: Waiting, fit: Fit | NoFit | None = None) -> list[Decision]:
        """Tell a waiting job why, when the reason changed."""
        if job.job_id in self._nominated:
            nodes = ", ".join(self._nominated[job.job_id])
            reason = f"needs {describe(job.spec)}; GPUs are being freed for it on {nodes}"
        else:
            fit = fit or self._capacity.fit(job.spec, self._blocked_for(job.job_id))
            if isinstance(fit, Fit):
                return []
            reason = fit.stable
            if fit.possible:
                self._impossible.pop(job.job_id)
            else:
                self._impossible[job.job_id] = None
        if self._reasons.get(job.job_id) == reason:
            return []
        self._reasons[job.job_id] = reason
        return [Wait(job.job_id, reason)]

    def _recheck_impossible(self) -> list[Decision]:
        decisions: list[Decision] = []
        for job_id in sorted(self._impossible):
            job = self._queues.jobs.get(job_id)
            self._impossible.pop(job_id)
            if job is not None:
                decisions += self._wait(job)
        return decisions

    # -- preemption and reservations ----------------------------------------

    def _preempt_for(self, job: Waiting, rank: dict[str, int]) -> list[Decision]:
        if not job.spec.allocated:
            return []
        # A plan that failed stays failed until the running work changes, or a
        # minute passes (contracts expire and ranks drift with time).
        attempt = (job.job_id, self._running_version.value)
        no_plan = self._no_plan.value
        if no_plan is not None and no_plan[0] == attempt and self.now < no_plan[1] + 60:
            return []
        candidates = [
            (node_id, node.gpu_count, len(self._capacity.free(node_id)))
            for node_id, node in sorted(self._capacity.nodes.items())
            if node_id not in self._reserved
            and (not job.spec.gpu_type or node.gpu_type == job.spec.gpu_type)
            and node.gpu_memory_gib >= job.spec.min_gpu_memory_gib
        ]
        plan = plan_preemption(job.spec, candidates, self._preemptible_by_node(), rank, self.now)
        if plan is None:
            self._no_plan.value = (attempt, self.now)
            return []
        for node_id in plan.node_ids:
            self._reserved[node_id] = (job.job_id, self.now)
        self._nominated[job.job_id] = plan.node_ids
        decisions: list[Decision] = []
        for victim in plan.victims:
            why = f"preempted for {job.job_id} of {job.spec.allocation}"
            decisions += self._stop(self._running[victim.job_id], StopCause.PREEMPTED, why)
        return decisions

    def _preemptible_by_node(self) -> dict[str, list[RunningJob]]:
        by_node: dict[str, list[RunningJob]] = {}
        for node_id, job_ids in self._on_node.items():
            for job_id in job_ids:
                run = self._running[job_id]
                if run.stopping is not None or len(run.tasks) > 1:
                    continue  # already going, or a gang (never preempted piecemeal)
                [(task_node, gpus)] = run.tasks.values()
                protect_s = min(run.spec.min_runtime_s, self.config.max_min_runtime_s)
                by_node.setdefault(node_id, []).append(
                    RunningJob(
                        job_id,
                        run.spec,
                        task_node,
                        len(gpus),
                        run.started_at,
                        run.idle,
                        run.seq,
                        protect_s,
                    )
                )
        return by_node

    def _blocked_for(self, job_id: str) -> set[str]:
        return {node for node, (holder, _) in self._reserved.items() if holder != job_id}

    def _release(self, job_id: str) -> None:
        for node in self._nominated.pop(job_id) or ():
            del self._reserved[node]

    def _expire_reservations(self) -> None:
        # Victims normally end within their stop grace; a node that never
        # reports back must not stay reserved forever.
        limit = self.now - 600
        for _node, (job_id, since) in sorted(self._reserved.items()):
            if since < limit:
                self._release(job_id)

    # -- fair share ----------------------------------------------------------

    def _usage(self) -> dict[str, float]:
        """Charged usage per allocation: the last snapshot plus what ran since,
        plus running work counted ``running_horizon_s`` ahead."""
        usage = dict(self._snapshot.value.usage)
        until = self.now + self.config.running_horizon_s
        for allocation, (gpus, weighted_start) in self._tally.items():
            accrued = gpus * until - weighted_start
            usage[allocation] = usage.get(allocation, 0.0) + accrued
        return usage

    def _count(self, run: _Running, sign: int) -> None:
        """Add (+1) or remove (-1) an allocated job's GPUs from its allocation's tally."""
        if not run.spec.allocated:
            return
        gpus = self._priced_gpus(run) * sign
        allocation = run.spec.allocation
        running, weighted_start = self._tally.get(allocation) or (0.0, 0.0)
        start = max(run.placed_at, self._snapshot.value.at)
        running, weighted_start = running + gpus, weighted_start + gpus * start
        if abs(running) < 1e-9:  # float sums: nothing left runs
            self._tally.pop(allocation)
        else:
            self._tally[allocation] = (running, weighted_start)

    def _priced_gpus(self, run: _Running) -> float:
        nodes = self._capacity.nodes
        return sum(
            len(g) * self.config.price(nodes[n].gpu_type if n in nodes else "")
            for n, g in run.tasks.values()
        )

    def _reweigh(self) -> None:
        # The snapshot now holds what ran before it: count running work from it on.
        weighted_start = dict.fromkeys(self._tally, 0.0)
        for run in self._running.values():
            if run.spec.allocated:
                start = max(run.placed_at, self._snapshot.value.at)
                weighted_start[run.spec.allocation] += self._priced_gpus(run) * start
        for allocation, weighted in weighted_start.items():
            self._tally[allocation] = (self._tally[allocation][0], weighted)

    def _rank(self) -> dict[str, int]:
        tree = self._tree.value
        if tree is None:
            return {}
        return {leaf: i for i, leaf in enumerate(leaf_order(tree, self._usage()))}

    def _standings(self) -> dict[str, Standing]:
        tree = self._tree.value
        if tree is None:
            return {}
        return standings(tree, self._usage(), self._entitlements)

    def _protected_until(self, run: _Running) -> float | None:
        if not run.spec.allocated or run.started_at is None:
            return None
        return run.started_at + min(run.spec.min_runtime_s, self.config.max_min_runtime_s)


def _snapshot_fact(snapshot: _Snapshot) -> str:
    return f"{snapshot.at}|{sorted(snapshot.usage.items())}"


def _tree_fact(tree: BudgetTree | None) -> str:
    if tree is None:
        return ""
    return "|".join(
        f"{n.name}:{n.parent}:{n.weight}" for n in sorted(tree.nodes, key=lambda n: n.name)
    )
