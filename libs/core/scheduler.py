"""The budget scheduler: a deterministic state machine driven by its input log.

``handle`` folds one input into the state and returns the decisions it causes.
The placement service, the simulator and the audit replayer all drive this
class, so the same inputs always yield the same decisions and digests.
Iteration follows insertion order (the input order) or sorted keys, never
hash order; time comes only from the inputs.

What it remembers is kept by parts, a module each: free GPUs (``capacity.py``),
the queues (``queues.py``), running work (``running.py``), what allocations are
charged (``charges.py``), preemption under way (``reservations.py``), node leases
(``liveness.py``), each user's completed runtimes (``estimates.py``), jobs that
wait for others (``dependencies.py``) and workflows (``compass``); this class
folds each input through them and runs the pass.

A scheduling pass, in order:
  0. serving first (``compass/serving.py``, ``compass/pool.py``): idle serving GPUs
     past their time go back to batch work, the pool grows onto freed GPUs, a
     backed-up pool takes GPUs back from batch work it may stop (``_reclaim``), and
     workflows no GPU could take are planned again;
  1. rank allocations by fair share: below their entitlement first, then the rest
     level by level (usage ÷ weight);
  2. walk the tiers: debug work (the fast path), allocated work, free work;
  3. in each tier, walk allocations in rank order and their jobs in queue
     order, placing every job that fits (best fit, gangs all or nothing);
  4. the first job of a tier that does not fit may preempt free work, and
     past-contract work of allocations ranked below its own, losing the least
     work; the nodes it frees are reserved for it (a gang's all in one step).
     When no room comes without throwing work away, the best-ranked blocked
     charged job holds the nodes that free soonest (``holds.py``): until it
     starts only work that cannot delay it runs there (free work, debug work,
     and charged work that will be gone in time);
  5. jobs that still wait get a reason when their reason changes.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from typing import NamedTuple

from libs.core import inputs
from libs.core.capacity import Capacity, Fit, NoFit, describe
from libs.core.charges import Charges
from libs.core.compass.pool import Want
from libs.core.compass.serving import GpuKey, Serving
from libs.core.config import PolicyConfig
from libs.core.contract import RunningJob, victim_order, victims_for
from libs.core.decisions import (
    WARNED,
    Cancel,
    Decision,
    GangPart,
    JobLost,
    NodeLost,
    Place,
    Preempted,
    Preemption,
    Protection,
    Refused,
    Reject,
    Requeue,
    ServingHeld,
    ServingReleased,
    Stop,
    StopCause,
    TaskLost,
    Wait,
    requeues,
)
from libs.core.dependencies import Dependencies, Outcome, waiting_reason
from libs.core.estimates import LearnedRuntimes
from libs.core.explain import Explanation, explain_running, explain_serving, explain_waiting
from libs.core.ids import JobId, NodeId, TaskId, batch_task_id, gang_rank
from libs.core.limits import MAX_GANG_NODES, MAX_WORKFLOW_TASKS
from libs.core.liveness import Liveness
from libs.core.model import JobSpec, NodeKind, NodeSpec, WorkClass
from libs.core.queues import TIERS, Queues, Waiting
from libs.core.reservations import Reservations
from libs.core.running import Running, RunningWork, Tasks
from libs.core.service_level import Asking, Occupancy, waiting_and_asked
from libs.core.state import Cell, State, Table
from libs.core.validation import joined, rejection, validate_node

POLICY = "budget"
# What each version changed: docs/policy-versions.md. A change that alters any
# decision for the same input bumps it and adds its line there.
POLICY_VERSION = 34
# What a pass asks of capacity for a job: (GPU type, memory, node kinds, GPUs, parts,
# backfills).
_Shape = tuple[str, float, frozenset[NodeKind], int, int, bool]
DEBUG_PLANS = 8  # debug jobs a pass may preempt for
ALLOCATED_PLANS = 3  # allocations whose blocked head a pass may preempt or hold for


class Reclaim(NamedTuple):
    """A job stopped for a backed-up serving pool, and whose workflows backed it up."""

    job_id: JobId
    allocation: str


class _Lender:
    """Serving's narrow view of the batch capacity (``serving.BatchGpus``): it takes
    free GPUs and gives them back, never on nodes reserved for a preempting job."""

    def __init__(self, capacity: Capacity, reserved: Table[NodeId, tuple[JobId, float]]) -> None:
        self._capacity = capacity
        self._reserved = reserved

    @property
    def total_gpus(self) -> int:
        return self._capacity.total_gpus

    @property
    def total_free(self) -> int:
        return self._capacity.total_free

    def node(self, node_id: NodeId) -> NodeSpec | None:
        return self._capacity.nodes.get(node_id)

    def free_gpus(self) -> Iterator[GpuKey]:
        for node_id in self._capacity.nodes:
            if node_id not in self._reserved and not self._capacity.is_cordoned(node_id):
                for index in self._capacity.free(node_id):
                    yield node_id, index

    def schedulable(self, spec: JobSpec) -> Mapping[NodeId, int]:
        return self._capacity.schedulable(spec)

    def take(self, key: GpuKey) -> None:
        self._capacity.take(key[0], (key[1],))

    def give(self, key: GpuKey) -> None:
        self._capacity.give(key[0], (key[1],))


class Scheduler:
    """The state machine. What it remembers is declared in ``self._state`` (tables
    and cells the digest covers by construction), by itself and by its parts; every
    other attribute is the config, the input clock, or a part."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.now = 0.0  # the input clock: the largest ``at`` of the log so far
        state = self._state = State()
        self._capacity = Capacity(state)
        self._queues = Queues(state)
        self._running = RunningWork(self.config, state)
        self._charges = Charges(self.config, state, self._capacity)
        self._reservations = Reservations(self.config, state)
        self._learned = LearnedRuntimes(state)
        self._dependencies = Dependencies(state)
        self._liveness = Liveness(self.config, state)
        self._reasons: Table[JobId, str] = state.table("reasons")  # the last Wait each job heard
        self._seen: Table[JobId, None] = state.table("seen")  # every job id decided on
        self._seq = state.cell("seq", 0)  # submission order
        self._impossible: Table[JobId, None] = state.table("impossible")  # no node can ever hold
        # Waiting jobs their users hold back: out of the queues, each keeping its place
        # in line (its sequence number) for when it is released.
        self._held: Table[JobId, Waiting] = state.table("held", Waiting.fact)
        # Workflows (DAGs of model-serving tasks) are planned by the serving core, in
        # tables of its own, on GPUs it borrows from this scheduler's capacity.
        lender = _Lender(self._capacity, self._reservations.reserved)
        self._serving = Serving(self.config, state, lender)
        # The job stopped to give a backed-up serving pool GPUs (``_reclaim``), and for
        # which allocation; and what the pool wanted when no running job could be stopped
        # for it, with the running work's version then: not looked for again until either
        # changes.
        self._reclaiming: Cell[Reclaim | None] = state.cell("serving.reclaiming", None)
        self._no_victim: Cell[tuple[Want, int] | None] = state.cell("serving.no_victim", None)

    # -- the one entry point -------------------------------------------------

    def handle(self, event: inputs.Input) -> list[Decision]:
        """Fold one input; never raises: an input it cannot act on is answered with a
        ``Reject`` (a job) or a ``Refused`` (anything else), and changes nothing."""
        decisions = self._fold(event)
        self._serving.pool.measure(self._now_ms)  # the GPUs serving keeps busy from now
        return decisions

    def _fold(self, event: inputs.Input) -> list[Decision]:
        self._liveness.excuse_silence(event.at - self.now)
        clock_moved = event.at > self.now
        self.now = max(self.now, event.at)
        decisions: list[Decision] = []
        reported = False  # it only reported on running batch work
        match event:
            case inputs.JobArrived():
                if event.job_id in self._seen:  # a duplicate submission: already decided
                    return []
                self._seen[event.job_id] = None
                rejected = rejection(event.job_id, event.spec)
                if rejected is not None:
                    return [rejected, *self._over(event.job_id, Outcome(False, "was rejected"))]
                if event.spec.workflow is not None:
                    decisions += self._serving.arrive(event.job_id, event.spec, self._now_ms)
                else:
                    self._seq.value += 1
                    arrived = self._arrive(
                        Waiting(event.job_id, event.spec, self._seq.value, 0, event.at)
                    )
                    if arrived and isinstance(arrived[0], Reject):
                        return arrived
                    decisions += arrived
            case inputs.NodeJoined():
                if violations := validate_node(event.node):
                    return [Refused(event.node.node_id, joined(violations))]
                if event.cache_model not in ("", self.config.serving_cache_model):
                    return [Refused(event.node.node_id, self._other_caches(event.cache_model))]
                decisions += self._register(event)
                decisions += self._recheck_impossible()
            case inputs.NodeHeartbeat():
                self._liveness.heard(event.node_id, event.incarnation, self.now)
                lost = self._expire_leases()
                if not lost:
                    return []  # only time passed: the next tick's pass sees it
                decisions += lost
            case inputs.TaskStarted() if self._serving.owns(event.task_id, event.node_id):
                self._serving.started(event.task_id, self._now_ms)
            case inputs.TaskStarted():
                self._running.started(event.job_id, event.task_id, event.at)
                reported = True
            case inputs.TaskEnded() if self._serving.owns(event.task_id, event.node_id):
                decisions += self._serving.ended(event.task_id, event.exit_code, self._now_ms)
            case inputs.TaskEnded():
                decisions += self._ended(
                    event.job_id, event.task_id, event.node_id, event.at, event.exit_code
                )
            case inputs.TaskRefused():
                refused = self._serving.refused(event, self._now_ms)
                if refused is None:
                    return [Refused(event.task_id, "a refusal of a task not queued on that GPU")]
                decisions += refused
            case inputs.ModelLoaded():
                self._serving.loaded(event.node_id, event.gpu_index, event.model, event.size_mb)
            case inputs.ModelEvicted():
                self._serving.evicted(event.node_id, event.gpu_index, event.model)
            case inputs.PeerPlaced() if not _finite_times(event.task):
                return [
                    Refused(event.task.task_id, "a peer's task needs finite, non-negative times")
                ]
            case inputs.PeerPlaced() if event.job_id in self._seen:
                # Its reports would be taken for this planner's own: never a peer's.
                return [Refused(event.task.task_id, "a task of a job this planner schedules")]
            case inputs.PeerPlaced():
                self._serving.peer_placed(event, self._now_ms)
            case inputs.PeerPlanned() if len(event.tasks) > MAX_WORKFLOW_TASKS or not all(
                _finite_times(task) for task in event.tasks
            ):
                return [
                    Refused(
                        event.job_id,
                        f"a peer's plan needs at most {MAX_WORKFLOW_TASKS} tasks, with "
                        "finite, non-negative sizes and times",
                    )
                ]
            case inputs.PeerPlanned() if event.job_id in self._seen:
                return [Refused(event.job_id, "a job this planner schedules")]
            case inputs.PeerPlanned():
                self._serving.peer_planned(event)
            case inputs.PeerArrived() if not (math.isfinite(event.work_ms) and event.work_ms >= 0):
                return [Refused(event.job_id, "a peer's workflow needs finite, non-negative work")]
            case inputs.PeerArrived() if event.job_id in self._seen:
                return [Refused(event.job_id, "a job this planner schedules")]
            case inputs.PeerArrived():
                self._serving.peer_arrived(event, self._now_ms)
            case inputs.TaskIdle():
                self._running.idle(event.job_id, event.task_id, event.idle)
                reported = True
            case inputs.TaskCheckpointed():
                self._running.checkpointed(event.job_id, event.task_id, event.at)
                reported = True
            case inputs.CancelRequested():
                served = self._serving.cancel(event.job_id, self._now_ms)
                decisions += self._cancel(event.job_id) if served is None else served
            case inputs.JobHeld():
                decisions += self._hold(event)
            case inputs.JobUpdated():
                decisions += self._update(event)
            case inputs.NodeCordoned():
                decisions += self._cordon(event)
            case inputs.BudgetSet():
                self._charges.set_tree(event.tree)
                self._running.changed()  # ranks changed
            case inputs.UsageSnapshot() if not all(math.isfinite(u) for _, u in event.usage):
                return [Refused("usage snapshot", "charged GPU-seconds must be finite numbers")]
            case inputs.UsageSnapshot():
                self._charges.snapshot(event.at, dict(event.usage), self._running.jobs.values())
        if clock_moved:
            decisions += self._time_out()
        decisions += self._expire_leases()
        fast = isinstance(event, inputs.JobArrived) and event.spec.work_class is WorkClass.DEBUG
        budget_changed = isinstance(event, inputs.BudgetSet)
        preempt = self._reservations.round_due(self.now, fast=fast, budget_changed=budget_changed)
        if reported and not (preempt or clock_moved):
            # It changed only what preemption reads (a contract's clock, idleness), and
            # no time passed: a pass could decide otherwise only in a preemption round.
            return self._settled(decisions)
        decisions += self._serving.release_idle(self._now_ms)
        # Workflows take freed GPUs before any batch tier: the fast path.
        decisions += self._serving.grow(self._now_ms)
        decisions += self._reclaim()
        if self._serving.waiting:
            decisions += self._serving.retry(self._now_ms)
        decisions += self._schedule(preempt)
        self._serving.pool.settle()
        if isinstance(event, inputs.JobArrived | inputs.JobHeld | inputs.JobUpdated) and (
            event.job_id not in self._reasons
        ):
            # Every new (or released) job hears why it waits, even when the pass stopped early.
            waiting = self._queues.jobs.get(event.job_id)
            if waiting is not None:
                decisions += self._wait(waiting)
        return self._settled(decisions)

    def _settled(self, decisions: list[Decision]) -> list[Decision]:
        """The input's decisions as they go out: serving's GPUs charged as they are held
        (``ServingHeld``, ``ServingReleased``: the ledger folds the same), and each
        placement addressed to its node's agent incarnation (see ``Place``)."""
        out: list[Decision] = []
        for decision in decisions:
            if isinstance(decision, ServingHeld | ServingReleased):
                self._charges.serving(decision, self.now)
            elif isinstance(decision, Place):
                incarnation = self._liveness.incarnations.get(decision.node_id, "")
                if incarnation:
                    decision = replace(decision, node_incarnation=incarnation)
            out.append(decision)
        return out

    def serving_gpus(self) -> int:
        """GPUs held for workflows now (taken from batch work)."""
        return len(self._serving.pool)

    def serving_stalled(self) -> bool:
        """Whether the serving pool is backed up and its last look for a job it may stop
        found none (and none is stopping for it): it grows only onto GPUs batch work
        frees. Work that started since is looked at in the next pass."""
        wanted = self._serving.pool.wanted
        last = self._no_victim.value
        return (
            wanted is not None
            and self._reclaiming.value is None
            and last is not None
            and last[0] == wanted
        )

    def free_gpus(self) -> tuple[int, int]:
        """Free GPUs now: those on nodes kept for a waiting job (being freed for it, or
        held until it starts), and the others."""
        capacity = self._capacity
        kept = sum(len(capacity.free(node_id)) for node_id in self._reservations.reserved)
        return kept, capacity.total_free - kept

    def nodes(self) -> Mapping[NodeId, NodeSpec]:
        """The nodes work may be placed on (registered, not lost), as it judges them."""
        return dict(self._capacity.nodes)

    def occupancy(self) -> Occupancy:
        """The cluster as the service levels count it (``service_level``), from this
        state: the console and the projector's metrics count the same from the views."""
        room: Counter[str] = Counter()
        for node in self._capacity.nodes.values():
            room[node.gpu_type] += node.gpu_count
        batch = (self._queues.jobs, self._held, self._dependencies.blocked)
        specs = (job.spec for job in itertools.chain.from_iterable(t.values() for t in batch))
        waiting, asked = waiting_and_asked(
            (
                Asking(spec.allocation, spec.allocated, spec.gpus, spec.gpu_type)
                for spec in itertools.chain(specs, self._serving.waiting.values())
            ),
            room,
        )
        held: Counter[str] = Counter(self._serving.pool.held.values())
        for run in self._running.jobs.values():
            if run.spec.allocated:
                tasks = (t for t in run.tasks.items() if t[0] not in run.ended)
                held[run.spec.allocation] += sum(len(gpus) for _, (_, gpus) in tasks)
        capacity = sum(room.values())
        busy = capacity - self._capacity.total_free
        return Occupancy(capacity, busy, waiting, dict(+held), asked)

    def estimate_s(self, spec: JobSpec) -> float | None:
        """How long a job is expected to run, for planning (never for charging): its
        requested limit, else its user's learned figure, else None."""
        return self._learned.estimate_s(spec)

    def digest(self) -> bytes:
        """A fingerprint of the whole declared state, recorded with every decision."""
        return self._state.digest()

    def recomputed_digest(self) -> bytes:
        """The digest hashed afresh from every declared fact (for tests: slow)."""
        return self._state.recomputed()

    def explain(self, job_id: JobId) -> Explanation | None:
        """Why a job waits (or where it runs), computed from the current state."""
        standing = self._charges.standings(self.now).get
        serving = self._serving.describe(job_id, self._now_ms)
        if serving is not None:
            allocation = self._serving.allocation_of(job_id)
            waiting = job_id in self._serving.waiting
            return explain_serving(job_id, allocation, standing(allocation), serving, waiting)
        held = self._held.get(job_id) or self._dependencies.blocked.get(job_id)
        if held is not None:
            return explain_waiting(
                held,
                standing(held.spec.allocation),
                reason=self._reasons.get(job_id, "held"),
                ahead=0,
                reserved=None,
                starts_at=None,
                now=self.now,
            )
        job = self._queues.jobs.get(job_id)
        if job is not None:
            fit = self._capacity.fit(job.spec, self._reservations.blocked_for(job_id))
            return explain_waiting(
                job,
                standing(job.spec.allocation),
                reason=fit.reason if not isinstance(fit, Fit) else "fits now: next in line",
                ahead=self._queues.ahead_of(job, self._charges.rank(self.now)),
                reserved=self._reservations.nominated.get(job_id),
                starts_at=self._reservations.holds.get(job_id),
                now=self.now,
            )
        run = self._running.jobs.get(job_id)
        if run is not None:
            return explain_running(
                job_id,
                run.spec.allocation,
                standing(run.spec.allocation),
                nodes=sorted({node for node, _ in run.tasks.values()}),
                protected_until=run.protected_until(self.config),
                borrowed=run.unprotected_borrower(self.config),
                free_stop_grace_s=None if run.spec.allocated else self.config.free_stop_grace_s,
                now=self.now,
                stopping=run.stopping,
                estimated_end=self._estimated_end(run),
            )
        return None

    @staticmethod
    def _estimated_end(run: Running) -> float | None:
        """By the estimate it was placed with: the one holds plan with."""
        if run.started_at is None or run.estimate_s is None:
            return None
        return run.started_at + run.estimate_s

    # -- folding inputs ------------------------------------------------------

    @property
    def _now_ms(self) -> float:
        return self.now * 1000

    def _dequeue(self, job_id: JobId) -> Waiting | None:
        job = self._queues.remove(job_id)
        if job is not None:
            self._reasons.pop(job_id)
            self._impossible.pop(job_id)
            self._reservations.release(job_id)
        return job

    def _ended(
        self, job_id: JobId, task_id: TaskId, node_id: NodeId, at: float, exit_code: int = 0
    ) -> list[Decision]:
        """A task ended; a report from another node than the task's is not believed. A
        part that exits non-zero while the job runs stops the rest of its gang."""
        run = self._running.end(job_id, task_id, node_id)
        if run is None:
            return []
        self._capacity.give(node_id, run.tasks[task_id][1])
        stopped: list[Decision] = []
        if exit_code != 0 and run.stopping is None and not run.failed:
            rank = gang_rank(task_id)
            part = "exited" if rank is None else f"rank {rank} exited"
            run = run.but(failed=f"{part} with code {exit_code}")
            self._running.update(job_id, failed=run.failed)  # a no-op once it is over
            if len(run.ended) < len(run.tasks):
                why = f"{run.failed}: its gang lives and dies as one"
                stopped = self._stop(run, StopCause.GANG_FAILED, why)
        reclaim = self._reclaiming.value
        adopted: list[Decision] = []
        if reclaim is not None and job_id == reclaim.job_id:  # its GPUs are serving's
            keys = [(node_id, i) for i in run.tasks[task_id][1]]
            adopted = self._serving.adopt(keys, reclaim.allocation, self._now_ms)
        if len(run.ended) < len(run.tasks):  # the rest of its gang still runs
            return stopped + adopted
        if reclaim is not None and job_id == reclaim.job_id:
            self._reclaiming.value = None  # requeued, it may run again: no longer a victim
        return adopted + self._job_ended(run, at)

    def _job_ended(self, run: Running, at: float) -> list[Decision]:
        """A job's last task ended: it is no longer charged; one that was stopped is
        requeued, or ends. The jobs waiting for one that ended hear how."""
        self._charges.count(run, -1)
        if run.stopping is None and run.started_at is not None:  # it ran to its end
            self._learned.completed(run.spec.user, at - run.started_at)
        if run.stopping is StopCause.PREEMPTED:
            what = run.stop_reason or "preempted"
        elif run.stopping is StopCause.NODE_LOST:
            what = run.lost
        elif run.stopping is StopCause.DRAINED:
            what = "its node was drained"
        else:
            return self._over(run.job_id, _outcome(run))
        if requeues(run.stopping, run.spec.resumable):
            how = "resumable" if run.spec.resumable else "it starts over: not resumable"
            self._queues.push(Waiting(run.job_id, run.spec, run.seq, run.attempt + 1, at))
            return [Requeue(run.job_id, f"{what}; requeued ({how})")]
        if run.stopping is StopCause.PREEMPTED:
            ended: Decision = Preempted(run.job_id, f"{what}; not resumable")
            outcome = Outcome(False, "was preempted")
        else:
            ended = JobLost(run.job_id, f"{what}; not resumable")
            outcome = Outcome(False, "was lost with its node")
        return [ended, *self._over(run.job_id, outcome)]

    def _arrive(self, job: Waiting) -> list[Decision]:
        """A batch job joins the queues, or waits for the jobs it names (``after``):
        rejected if one is unknown, cancelled if one already ended otherwise than asked."""
        after = job.spec.after
        if not after:
            self._queues.push(job)
            return []
        unknown = [d.job_id for d in after if d.job_id == job.job_id or d.job_id not in self._seen]
        if unknown:
            why = f"no job {unknown[0]} to wait for (only for jobs submitted before it)"
            return [
                Reject(job.job_id, "after", why),
                *self._over(job.job_id, Outcome(False, "was rejected")),
            ]
        self._dependencies.block(job)
        return self._judge(job)

    def _judge(self, job: Waiting) -> list[Decision]:
        """Judge a blocked job's dependencies again: it joins the queues, is cancelled,
        or hears which it waits for now."""
        verdict = self._dependencies.judge(job)
        if verdict.waits_for is not None:
            reason = waiting_reason(verdict.waits_for)
            if self._reasons.get(job.job_id) == reason:
                return []
            self._reasons[job.job_id] = reason
            return [Wait(job.job_id, reason)]
        self._dependencies.unblock(job.job_id)
        self._reasons.pop(job.job_id, None)
        if verdict.ready:
            self._queues.push(job)
            return []
        cancelled = Cancel(job.job_id, f"cancelled: {verdict.broken}")
        return [cancelled, *self._over(job.job_id, Outcome(False, "was cancelled"))]

    def _over(self, job_id: JobId, outcome: Outcome) -> list[Decision]:
        """``job_id`` ended for good: the jobs waiting for it are judged again (a
        cancelled one's own dependents in turn, through ``_judge``)."""
        return [
            decision
            for waiting in self._dependencies.ended(job_id, outcome)
            for decision in self._judge(waiting)
        ]

    def _time_out(self) -> list[Decision]:
        """Stop the jobs that ran to their time limit: they end TIMEOUT."""
        decisions: list[Decision] = []
        for job_id in self._running.past_deadline(self.now):
            run = self._running.jobs[job_id]
            why = f"reached its time limit of {run.spec.time_limit_s} s"
            decisions += self._stop(run, StopCause.TIME_LIMIT, why)
        return decisions

    def _cancel(self, job_id: JobId) -> list[Decision]:
        cancelled = Outcome(False, "was cancelled")
        if self._dequeue(job_id) is not None:
            return [Cancel(job_id, "cancelled before it started"), *self._over(job_id, cancelled)]
        if self._held.pop(job_id, None) is not None:
            self._reasons.pop(job_id, None)
            return [Cancel(job_id, "cancelled while held"), *self._over(job_id, cancelled)]
        if self._dependencies.unblock(job_id) is not None:
            self._reasons.pop(job_id, None)
            why = "cancelled while it waited for its dependencies"
            return [Cancel(job_id, why), *self._over(job_id, cancelled)]
        run = self._running.jobs.get(job_id)
        if run is not None and run.stopping is None:
            return self._stop(run, StopCause.CANCELLED, "cancelled by user")
        return []

    def _stop(
        self, run: Running, cause: StopCause, reason: str, preemption: Preemption | None = None
    ) -> list[Decision]:
        self._running.update(run.job_id, stopping=cause, stop_reason=reason)
        preempted_free = cause is StopCause.PREEMPTED and not run.spec.allocated
        grace_s = self.config.free_stop_grace_s if preempted_free else 0.0
        warn_s = run.warning_s(self.config) if cause in WARNED else 0.0
        warn_signal = run.spec.warning_signal if warn_s else ""
        return [
            Stop(
                run.job_id,
                task_id,
                node_id,
                cause,
                reason,
                grace_s,
                preemption,
                warn_signal,
                warn_s,
            )
            for task_id, (node_id, _) in sorted(run.tasks.items())
            if task_id not in run.ended
        ]

    def _preempt(self, victim: JobId, for_job: str, allocation: str) -> list[Decision]:
        """Stop ``victim`` for ``for_job`` (empty: for workflow serving) of ``allocation``,
        saying by which rule (its requeue or end repeats it)."""
        run = self._running.jobs[victim]
        preemption = Preemption(for_job, allocation, run.preemption_rule(self.config, self.now))
        return self._stop(run, StopCause.PREEMPTED, str(preemption), preemption)

    def _hold(self, event: inputs.JobHeld) -> list[Decision]:
        """Hold a waiting job back, or release it into its old place in line."""
        job_id = event.job_id
        if event.held:
            if job_id in self._held:
                return []
            job = self._dequeue(job_id)
            if job is None:
                return [Refused(job_id, "only a batch job that waits can be held")]
            self._held[job_id] = job
            who = event.requested_by or "its user"
            reason = self._reasons[job_id] = f"held by {who}: starts once released (qm release)"
            return [Wait(job_id, reason)]
        released = self._held.pop(job_id, None)
        if released is None:
            return [] if job_id in self._queues.jobs else [Refused(job_id, "is not held")]
        self._reasons.pop(job_id, None)
        self._queues.push(released)
        return []

    def _update(self, event: inputs.JobUpdated) -> list[Decision]:
        """Give a waiting (or held) job its new spec; it keeps its place in line."""
        job_id, spec = event.job_id, event.spec
        old = self._queues.jobs.get(job_id) or self._held.get(job_id)
        if old is None or spec.workflow is not None:
            return [Refused(job_id, "only a batch job that waits can be updated")]
        if (rejected := rejection(job_id, spec)) is not None:
            return [Refused(job_id, rejected.reason)]  # the job stays as it was
        updated = replace(old, spec=spec)
        if job_id in self._held:
            self._held[job_id] = updated
        else:
            self._dequeue(job_id)
            self._queues.push(updated)
        return []

    def _cordon(self, event: inputs.NodeCordoned) -> list[Decision]:
        """Take a node out of scheduling or give it back; a drain also stops the work
        that runs there (``_ended`` requeues it)."""
        node_id = event.node_id
        if node_id not in self._capacity.nodes and not self._capacity.is_cordoned(node_id):
            return [Refused(node_id, "no node of that name has registered")]
        self._capacity.cordon(node_id, event.cordoned)
        if not event.cordoned:
            return []
        self._reservations.release_node(node_id)
        if not event.drain:
            return []
        why = f"node {node_id} drained by {event.requested_by or 'an operator'}"
        decisions: list[Decision] = []
        for job_id in self._running.on_node(node_id):
            run = self._running.jobs[job_id]
            if run.stopping is None:
                decisions += self._stop(run, StopCause.DRAINED, why)
        return decisions

    # -- liveness --------------------------------------------------------------

    def _other_caches(self, cache_model: str) -> str:
        """Why a node whose agent keeps its caches otherwise than planned is refused:
        every plan would count the wrong loads and evictions there."""
        planned = self.config.serving_cache_model
        said = cache_model[:40]  # as the agent said it (the record's reason is cut anyway)
        return (
            f"its agent's model caches are {said!r} and placement plans for {planned!r} "
            f"(serving_cache_model): start the agent with --cache-model {planned}, or "
            f"set the policy's serving_cache_model to the agents' model"
        )

    def _register(self, event: inputs.NodeJoined) -> list[Decision]:
        """A node (re)registered. Another incarnation means its agent restarted and
        killed what it ran: those tasks are lost, and its GPUs come back free. The same
        one means its agent restarted and took its tasks back; but an incarnation
        declared lost stays lost (its tasks were counted lost, and may still run there
        until its agent hears so and registers anew)."""
        node = event.node
        known = self._liveness.incarnations.get(node.node_id)
        lost = node.node_id not in self._capacity.nodes and event.heartbeat_s > 0
        if event.incarnation and known == event.incarnation and lost:
            why = f"incarnation {event.incarnation} was declared lost: register a new one"
            return [Refused(node.node_id, why)]
        decisions: list[Decision] = []
        if self._liveness.register(node.node_id, event.incarnation, event.heartbeat_s, self.now):
            restarted = f"the node agent on {node.node_id} restarted"
            decisions += self._lose_tasks(node.node_id, restarted)
            decisions += self._serving.lose(node.node_id, restarted, self._now_ms)
        if self._capacity.nodes.get(node.node_id) != node:
            held = self._serving.held_on(node.node_id) | self._running.held_on(node.node_id)
            self._capacity.add(node, held)
        self._serving.add_node(node)
        return decisions

    def _expire_leases(self) -> list[Decision]:
        """Declare lost the nodes silent for longer than the timeout, oldest first."""
        decisions: list[Decision] = []
        for node_id, silent in self._liveness.expire(self.now):
            incarnation = self._liveness.incarnations.get(node_id, "")
            decisions.append(NodeLost(node_id, incarnation, silent))
            why = f"node {node_id} lost: {silent}"
            decisions += self._lose_tasks(node_id, why)
            decisions += self._serving.lose(node_id, why, self._now_ms)
            self._capacity.remove(node_id)
            self._reservations.release_node(node_id)
        return decisions

    def _lose_tasks(self, node_id: NodeId, why: str) -> list[Decision]:
        """End every task on the node as lost; a gang's tasks elsewhere are stopped."""
        decisions: list[Decision] = []
        for job_id in self._running.on_node(node_id):
            run = self._running.jobs[job_id]
            if run.stopping is None:
                self._running.update(job_id, stopping=StopCause.NODE_LOST, lost=why)
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

    # -- the scheduling pass -------------------------------------------------

    def _schedule(self, preempt: bool) -> list[Decision]:
        if not self._queues:
            return []
        self._reservations.expire(self.now)
        if not (preempt or self._capacity.total_free):
            return self._tell_heads()  # the pass below would only do this, ranking first
        rank = self._charges.rank(self.now)
        nominated = self._nominated_heads()
        decisions: list[Decision] = []
        # Jobs that preempted for room go first, on the nodes freed for them.
        decisions += self._place_nominated(held=False)
        # Shapes (type, memory, GPUs, may use held nodes) that did not fit: capacity
        # only shrinks during a pass, so jobs of the same shape need not be tried again.
        failed: set[_Shape] = set()
        for tier in TIERS:
            if tier is WorkClass.ALLOCATED:  # after the fast path, a hold's turn
                decisions += self._place_nominated(held=True)
            # Planning scans the running work, so a pass plans for few jobs: the
            # heads of the best-ranked allocations with blocked work, and a handful of
            # debug jobs (small, short, and meant to start within seconds).
            tries = 0
            if preempt and tier is not WorkClass.UNALLOCATED:
                tries = DEBUG_PLANS if tier is WorkClass.DEBUG else ALLOCATED_PLANS
            planned: set[JobId] = set()
            for allocation in sorted(
                self._queues.allocations(tier), key=lambda a: (rank.get(a, len(rank)), a)
            ):
                if not (tries or self._may_place(tier)):
                    # Nothing left to place or plan for (the common case once a pass has
                    # filled the freed GPUs): only a head that has not heard why it waits.
                    decisions += self._tell_head(tier, allocation, nominated)
                    continue
                decisions += self._place_allocation(tier, allocation, failed, rank)
                head = self._queues.head(tier, allocation)
                if head is None:
                    continue
                blocked = (
                    self._queues.in_order(tier, allocation, tries)
                    if tier is WorkClass.DEBUG
                    else [head]
                )
                for job in blocked:
                    freeing = job.job_id in self._reservations.nominated
                    if tries and (not freeing or job.job_id in self._reservations.holds):
                        tries -= 1
                        planned.add(job.job_id)
                        decisions += self._preempt_for(job, rank)
                        nominated = self._nominated_heads()
                decisions += self._tell_head(tier, allocation, nominated)
            if preempt and tier is WorkClass.ALLOCATED:
                self._reservations.keep_holds(planned)
        if self._capacity.total_free and not self._queues.allocations(WorkClass.UNALLOCATED):
            # The debug headroom is kept free for free work to fill; with none
            # waiting, idle GPUs would help nobody, so allocated work may take them.
            for allocation in sorted(
                self._queues.allocations(WorkClass.ALLOCATED),
                key=lambda a: (rank.get(a, len(rank)), a),
            ):
                decisions += self._place_allocation(
                    WorkClass.ALLOCATED, allocation, failed, rank, headroom=False
                )
        return decisions

    def _reclaim(self) -> list[Decision]:
        """A backed-up serving pool with no free GPU to grow onto stops one job on a
        GPU it can use, as its allocation's own work could (free work at once, charged
        work ranked below it and past its contract that resumes, losing nothing); the
        pool takes its GPUs as they free. One at a time: none while the last one stops.
        Among those that lose the least, the one that frees the most of what the pool
        is short (``Pool.shortfall``) goes first: a burst is met in a grace or two, not
        a grace per GPU."""
        wanted = self._serving.pool.wanted
        if wanted is None or self._reclaiming.value is not None:
            return []
        tried = (wanted, self._running.version)
        if self._no_victim.value == tried:
            return []
        fits, reserved = self._serving.pool.fits, self._reservations.reserved

        def open_node(node_id: NodeId) -> bool:
            return node_id not in reserved and not self._capacity.is_cordoned(node_id)

        def usable_gpus(job_id: JobId) -> int:
            """The GPUs stopping the job frees that the pool can take."""
            return sum(
                fits((node_id, index), wanted.gpu_type, wanted.need_mb)
                for node_id, gpus in self._running.jobs[job_id].tasks.values()
                if open_node(node_id)
                for index in gpus
            )

        frees: dict[JobId, tuple[RunningJob, int]] = {}  # a gang is listed on each node
        for node_id, jobs in self._running.preemptible_by_node().items():
            for victim in jobs if open_node(node_id) else ():
                if victim.job_id not in frees and (gpus := usable_gpus(victim.job_id)):
                    frees[victim.job_id] = (victim, gpus)
        usable = [victim for victim, _ in frees.values()]
        victims = [v for v in usable if not v.spec.allocated]  # no rank needed: the common case
        rank: dict[str, int] = {}
        if not victims and usable:
            rank = self._charges.rank(self.now)
            may_take = victims_for(wanted.allocation, rank, self.now)
            # Only work that resumes: one that cannot ends when stopped, even as it starts.
            victims = [v for v in usable if may_take(v) and v.spec.resumable]
        if not victims:
            self._no_victim.value = tried
            return []
        short = self._serving.pool.shortfall()
        victim = min(
            victims,
            key=lambda v: (
                v.lost_gpu_s(self.now),
                -min(frees[v.job_id][1], short),
                victim_order(v, rank, self.now),
            ),
        )
        self._reclaiming.value = Reclaim(victim.job_id, wanted.allocation)
        return self._preempt(victim.job_id, "", wanted.allocation)

    def _tell_heads(self) -> list[Decision]:
        """``_tell_head`` for every allocation, tier by tier in rank order; the rank is
        computed only when a head is to hear something (most passes on a full cluster
        have nothing to say)."""
        nominated = self._nominated_heads()
        untold: list[tuple[WorkClass, str]] = []
        for tier in TIERS:
            for allocation in self._queues.moved(tier) | {a for t, a in nominated if t is tier}:
                if self._untold(tier, allocation):
                    untold.append((tier, allocation))
                else:
                    self._queues.settle(tier, allocation)
        if not untold:
            return []
        rank = self._charges.rank(self.now)
        untold.sort(key=lambda t: (TIERS.index(t[0]), rank.get(t[1], len(rank)), t[1]))
        return [
            d for tier, allocation in untold for d in self._tell_head(tier, allocation, nominated)
        ]

    def _nominated_heads(self) -> set[tuple[WorkClass, str]]:
        """(tier, allocation) of the jobs that nodes are being freed or held for."""
        jobs = self._queues.jobs
        return {
            (jobs[job_id].spec.work_class, jobs[job_id].spec.allocation)
            for job_id in self._reservations.nominated
        }

    def _untold(self, tier: WorkClass, allocation: str) -> Waiting | None:
        """The allocation's first waiting job, if it has not heard why it waits, or its
        nodes are being freed or held (which changes as they are)."""
        head = self._queues.head(tier, allocation)
        if head is None or (
            head.job_id in self._reasons and head.job_id not in self._reservations.nominated
        ):
            return None
        return head

    def _tell_head(
        self, tier: WorkClass, allocation: str, nominated: set[tuple[WorkClass, str]]
    ) -> list[Decision]:
        """The allocation's first job hears why it waits, if it has not (or its nodes
        are being freed or held). Only allocations whose first job moved since it heard,
        and those with nominated jobs, are looked at (``Queues.moved``)."""
        if allocation not in self._queues.moved(tier) and (tier, allocation) not in nominated:
            return []
        head = self._untold(tier, allocation)
        decisions = [] if head is None else self._wait(head)
        if head is None or head.job_id in self._reasons:
            self._queues.settle(tier, allocation)  # a head that fits now is asked again
        return decisions

    def _place_nominated(self, *, held: bool) -> list[Decision]:
        """Place the jobs with nodes reserved for them that fit now: those whose nodes
        are held, or those whose nodes are being freed."""
        decisions: list[Decision] = []
        if not self._capacity.total_free:
            return decisions
        for job_id in sorted(self._reservations.nominated):
            if (job_id in self._reservations.holds) != held:
                continue
            job = self._queues.jobs[job_id]
            if job.spec.gpus > self._capacity.total_free:
                continue  # surely no fit: skip building the nodes it may not use
            fit = self._capacity.fit(job.spec, self._reservations.blocked_for(job_id))
            if isinstance(fit, Fit):
                decisions += self._place(job, fit)
        return decisions

    def _place_allocation(
        self,
        tier: WorkClass,
        allocation: str,
        failed: set[_Shape],
        rank: dict[str, int],
        *,
        headroom: bool = True,
    ) -> list[Decision]:
        decisions: list[Decision] = []
        capacity = self._capacity
        if not self._may_place(tier, headroom=headroom):
            return decisions
        # Nominated jobs were placed before this. Held nodes take only work that cannot
        # delay their holder: free work (always preemptible), debug work (small and
        # short), and charged work that will be gone in time (``_backfills``).
        all_reserved = self._reservations.reserved.keys()
        held = self._reservations.held()
        open_nodes = self._reservations.open_nodes() if held else all_reserved
        reserved: Collection[NodeId] = all_reserved
        if tier is not WorkClass.ALLOCATED:
            reserved = open_nodes
        largest, node_size, whole = capacity.shape(open_nodes)

        def could_fit(gpus: int) -> bool:
            # A gang spans whole free nodes; anything else needs one free block.
            return gpus <= largest or node_size < gpus <= whole

        may_backfill = bool(held) and tier is WorkClass.ALLOCATED
        last: tuple[int, int, JobId] | None = None  # the last job walked past
        walking = True
        while walking:
            walking = False  # unless a placement changes what fits: then walk on after it
            for job in self._queues.candidates(tier, allocation, could_fit, last):
                last = job.key
                spec = job.spec
                if (
                    headroom
                    and tier is WorkClass.ALLOCATED
                    and not self._leaves_headroom(spec.gpus)
                ):
                    return decisions
                need = (
                    spec.gpu_type,
                    spec.min_gpu_memory_gib,
                    spec.node_kinds,
                    spec.gpus,
                    spec.parts,
                )
                if (*need, False) in failed and (not may_backfill or (*need, True) in failed):
                    continue  # its shape failed whether it backfills or not: no need to ask
                backfills = may_backfill and self._backfills(job, rank)
                shape: _Shape = (*need, backfills)
                if shape in failed:
                    continue
                fit = capacity.fit(spec, open_nodes if backfills else reserved)
                if isinstance(fit, NoFit):
                    failed.add(shape)
                    decisions += self._wait(job, fit)
                    continue
                decisions += self._place(job, fit)
                if capacity.total_free == 0:
                    return decisions
                largest, node_size, whole = capacity.shape(open_nodes)
                # ``held`` is the live set: placing a holder on its nodes releases them.
                may_backfill = bool(held) and tier is WorkClass.ALLOCATED
                walking = True
                break
        return decisions

    def _backfills(self, job: Waiting, rank: dict[str, int]) -> bool:
        """Whether charged work may run on held nodes: it will be gone when the holder
        likely starts, by its runtime estimate, or because its contract ends by then
        and the holder ranks above it (and so may preempt it)."""
        unknown = len(rank)
        mine = rank.get(job.spec.allocation, unknown)
        estimate = self.estimate_s(job.spec)
        protect = min(job.spec.min_runtime_s, self.config.max_min_runtime_s)
        for holder, start in self._reservations.holds.items():
            if estimate is not None and self.now + estimate <= start:
                continue
            holder_rank = rank.get(self._queues.jobs[holder].spec.allocation, unknown)
            if not (mine > holder_rank and self.now + protect <= start):
                return False
        return True

    def _may_place(self, tier: WorkClass, *, headroom: bool = True) -> bool:
        """Whether a pass may place any job of the tier now: GPUs are free and, for
        allocated work, even the smallest job (1 GPU) would leave the debug headroom
        (an allocation's turn ends at its first job that would not)."""
        if not self._capacity.total_free:
            return False
        return not (headroom and tier is WorkClass.ALLOCATED) or self._leaves_headroom(1)

    def _leaves_headroom(self, gpus: int) -> bool:
        headroom = int(self.config.debug_headroom * self._capacity.total_gpus)
        free_work = self._running.free_work_gpus
        return self._capacity.total_free - gpus + free_work >= headroom

    def _place(self, job: Waiting, fit: Fit) -> list[Decision]:
        """Start the job where it fits; each task says how the job is protected."""
        self._dequeue(job.job_id)
        tasks: Tasks = {}
        for rank, (node_id, gpus) in enumerate(fit.tasks):
            task_id = batch_task_id(job.job_id, job.attempt, rank if len(fit.tasks) > 1 else None)
            tasks[task_id] = (node_id, gpus)
            self._capacity.take(node_id, gpus)
        borrowed = self._charges.borrows(job.spec, tasks)
        gang: tuple[GangPart, ...] = ()
        port = 0
        if len(fit.tasks) > 1:
            nodes = self._capacity.nodes
            gang = tuple(GangPart(n, nodes[n].address, len(gpus)) for n, gpus in fit.tasks)
            port = self._rendezvous_port(fit.tasks[0][0])
        estimate_s = self.estimate_s(job.spec)
        run = self._running.place(job, tasks, self.now, estimate_s, borrowed, port)
        self._charges.count(run, +1)
        protection = run.protection(self.config)
        protected_s = run.protect_s(self.config) if protection is Protection.CONTRACT else 0.0
        return [
            Place(
                job.job_id,
                task_id,
                node_id,
                gpus,
                job.spec,
                protection=protection,
                protected_s=protected_s,
                gang=gang,
                master_port=port,
            )
            for task_id, (node_id, gpus) in tasks.items()
        ]

    def _rendezvous_port(self, node_id: NodeId) -> int:
        """The lowest of the policy's rendezvous ports that no gang whose rank 0 runs on
        ``node_id`` holds (there are more than a node has GPUs: 0 never happens)."""
        used = self._running.ports_in_use(node_id)
        first = self.config.rendezvous_port
        return next(
            (p for p in range(first, first + self.config.rendezvous_ports) if p not in used), 0
        )

    def _wait(self, job: Waiting, fit: Fit | NoFit | None = None) -> list[Decision]:
        """Tell a waiting job why, when the reason changed."""
        nominated = self._reservations.nominated.get(job.job_id)
        if nominated is not None:
            nodes = ", ".join(nominated)
            if job.job_id in self._reservations.holds:
                reason = f"needs {describe(job.spec)}; {nodes} are held for it as they free up"
            else:
                reason = f"needs {describe(job.spec)}; GPUs are being freed for it on {nodes}"
        else:
            fit = fit or self._capacity.fit(job.spec, self._reservations.blocked_for(job.job_id))
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

    def _preempt_for(self, job: Waiting, rank: dict[str, int]) -> list[Decision]:
        yielded = self._yield_serving(job, rank)
        if yielded:
            return yielded
        victims = self._reservations.plan_for(
            job,
            self._capacity,
            self._running,
            rank,
            self.now,
            reclaims=self._charges.reclaims(job.spec),
        )
        decisions: list[Decision] = []
        for victim in victims:
            decisions += self._preempt(victim.job_id, job.job_id, job.spec.allocation)
        return decisions

    def _yield_serving(self, job: Waiting, rank: dict[str, int]) -> list[Decision]:
        """Budget pressure on serving: a blocked charged job takes idle serving GPUs held
        for allocations past their share (borrowed, as charged work placed there is) and,
        unless it is debug work, ranked below its own (``contract.victims_for``'s rule),
        on the nodes where they make room for it with the fewest given back: the one
        node a job that fits on one needs, or the whole nodes a gang lacks
        (``Capacity.fit``'s rule), each share counted over all of them. The cheapest
        victims: they lose nothing. Never the ``serving_reserve_min`` warm GPUs
        (``Pool.idle_by_node``). Placed at once, or nothing."""
        spec = job.spec
        idle = self._serving.pool.idle_by_node()
        if not idle or not spec.allocated:
            return []
        nodes = self._capacity.schedulable(spec)
        if not nodes:
            return []  # no node may take it (its type, or all cordoned)
        size = max(nodes.values())
        blocked = self._reservations.blocked_for(job.job_id)
        per_node, wanted = spec.gpus, 1
        if spec.parts > 1:
            return []  # serving's GPUs yield to one-node jobs and whole-node gangs only
        if spec.gpus > size:  # a gang: whole nodes of the largest size
            needed = -(-spec.gpus // size)
            if needed > MAX_GANG_NODES:
                return []
            whole = sum(
                1
                for node_id, count in nodes.items()
                if count == size
                and node_id not in blocked
                and len(self._capacity.free(node_id)) == size
            )
            per_node, wanted = size, needed - whole
        rooms = sorted(
            (per_node - len(self._capacity.free(node_id)), node_id)
            for node_id in idle
            if nodes.get(node_id, 0) >= per_node and node_id not in blocked
        )
        debug = spec.work_class is WorkClass.DEBUG
        unknown = len(rank)
        own = rank.get(spec.allocation, unknown)
        # What each holder holds beyond its share, priced, less what this job takes.
        beyond: dict[str, float] = {}

        def borrowed(holder: str) -> float:
            if not debug and rank.get(holder, unknown) <= own:
                return 0.0
            if holder not in beyond:
                beyond[holder] = self._charges.beyond_share(holder)
            return beyond[holder]

        given: list[GpuKey] = []
        made = 0  # nodes given room
        for need, node_id in rooms:
            if made == wanted:
                break
            price = self._charges.price_of(node_id)
            left = {holder: borrowed(holder) for _, holder in idle[node_id]}
            keys: list[GpuKey] = []
            for key, holder in idle[node_id]:
                if len(keys) == need:
                    break
                if left[holder] > 1e-9:
                    left[holder] -= price
                    keys.append(key)
            if 0 < need == len(keys):
                beyond.update(left)
                given += keys
                made += 1
        if made < wanted or not given:
            return []
        decisions = self._serving.give_back(given)
        fit = self._capacity.fit(spec, blocked)
        if isinstance(fit, Fit):  # always: those nodes have room for it now
            decisions += self._place(job, fit)
        return decisions


def _outcome(run: Running) -> Outcome:
    """How a job that ran ended, as the jobs waiting for it judge it."""
    match run.stopping:
        case None if run.failed:
            return Outcome(False, f"failed ({run.failed})")
        case None:
            return Outcome(True, "finished")
        case StopCause.TIME_LIMIT:
            return Outcome(False, "timed out")
        case StopCause.GANG_FAILED:
            return Outcome(False, f"failed ({run.failed})")
        case _:
            return Outcome(False, "was cancelled")


def _finite_times(task: inputs.PeerTask) -> bool:
    """A peer's task states finite, non-negative sizes and times."""
    return all(math.isfinite(v) and v >= 0 for v in (task.model_mb, task.run_ms, task.ready_ms))
