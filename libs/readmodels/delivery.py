"""Each allocation's owed and delivered GPU-seconds over the lookback window, folded from
the log, for ``qm budget usage``: by the console's definitions (``libs.readmodels.
occupancy``'s ``Sample`` and ``Timeline``, ``service_level.could_place``), on the log's own
facts. The console's live samples agree; the window a console rebuilds when it starts
(``occupancy.history``) is coarser (today's nodes, each job's latest attempt) and may not.

The console samples the projector's views as time passes. The budget service has the log
instead, and reads its two topics one after the other when it starts, so records meet out
of time order: a task's end before its placement, a node's loss after its next
registration. The fold therefore keeps facts with their own times, in any order: when
each node registered and was lost, when each task took its GPUs and gave them back (a
GPU serving holds from ``ServingHeld`` to its release), when each job began to wait (its
submission, each requeue) and stopped (a placement, its end). Asked for the window
(``timeline``), it plays the facts forward: the state after each moment something
changed is an occupancy ``Sample``, integrated by a ``Timeline`` as the console's is,
with ``libs.core.service_level``'s definitions. Jobs and tasks wholly before the window
are dropped as the log's clock passes them (nodes are kept: they are few).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby

from qm.v1 import budget_service_pb2, events_pb2, types_pb2

from libs.core.service_level import TARGET_DELIVERED_PCT, Headline, could_place, small_team
from libs.events import event_type, occurred_at
from libs.events.wire_time import duration
from libs.readmodels.jobs import Scope
from libs.readmodels.occupancy import Account, Gpus, Sample, Timeline, is_charged

# Facts folded between two prunes of those the window has left.
PRUNE_EVERY = 4096
# How much log time a window's figures serve before they are played again: a window of
# days moves little in half a minute, and playing it costs about 0.05 ms a job in it
# (0.9 s at 20,000 jobs, on the service's event loop), however many of them wait.
REPLAY_EVERY_S = 30.0
_STOPS_WAITING = ("job_rejected", "job_cancelled", "job_preempted", "job_lost")
_TASK_ENDS = ("task_finished", "task_failed", "task_refused", "task_lost")


@dataclass
class _Node:
    registrations: list[tuple[float, str, Counter[str]]] = field(default_factory=list)
    losses: dict[str, float] = field(default_factory=dict)  # incarnation -> when

    def changes(self) -> Iterator[tuple[float, Counter[str] | None]]:
        """When its GPUs (by type) came and went (None: lost), in time order."""
        facts: list[tuple[float, str, Counter[str] | None]] = [*self.registrations]
        facts += [(at, incarnation, None) for incarnation, at in self.losses.items()]
        current = ""
        for at, incarnation, gpus in sorted(facts, key=lambda fact: fact[0]):
            if gpus is not None:
                current = incarnation
                yield at, gpus
            elif incarnation == current:  # a loss of an earlier incarnation changes nothing
                yield at, None


@dataclass
class _Held:
    """GPUs one task (or one serving GPU) held; a time is None until its record is read."""

    allocation: str = ""
    charged: bool = False
    gpus: int = 0
    since: float | None = None
    until: float | None = None


@dataclass
class _Job:
    allocation: str = ""
    gpus: int = 0
    gpu_type: str = ""
    charged: bool = False
    spec_at: float = -math.inf  # when the spec kept was written: a later one replaces it
    submitted: float | None = None  # its earliest submission: later ones lost (duplicates)
    requeued: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)  # placements, and its end: sorted

    def waits(self) -> Iterator[tuple[float, float | None]]:
        """Each time it waited, from its submission or a requeue to the next placement or
        its end (None: it waits still)."""
        starts = ([] if self.submitted is None else [self.submitted]) + self.requeued
        for start in starts:
            at = bisect.bisect_left(self.stopped, start)
            yield start, self.stopped[at] if at < len(self.stopped) else None

    def take(self, spec: types_pb2.JobSpec, at: float) -> None:
        if at >= self.spec_at:
            self.allocation, self.gpus, self.gpu_type = spec.allocation, spec.gpus, spec.gpu_type
            self.charged, self.spec_at = is_charged(spec), at


class DeliveryLedger:
    """Facts of both topics, folded in any order; ``timeline`` integrates the window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.now = 0.0  # the log's clock: the latest record's time
        self._first = math.inf  # the earliest record's time
        self._nodes: dict[str, _Node] = {}
        self._tasks: dict[str, _Held] = {}
        self._serving: list[_Held] = []
        self._serving_now: dict[tuple[str, int], _Held] = {}
        self._jobs: dict[str, _Job] = {}
        self._folded = 0
        # The last window played: for which entitlements, at which log time.
        self._played: tuple[tuple[tuple[str, float], ...], float, Timeline] | None = None

    def apply(self, env: events_pb2.Envelope) -> None:
        """Fold one record of the events or the decisions topic."""
        at, kind = occurred_at(env), event_type(env)
        self.now, self._first = max(self.now, at), min(self._first, at)
        if kind in ("node_registered", "node_lost", "serving_held", "serving_released"):
            self._node_fact(getattr(env, kind), at)
        elif kind in _TASK_ENDS:
            ended = self._tasks.setdefault(getattr(env, kind).task_id, _Held())
            ended.until = at if ended.until is None else min(ended.until, at)
        elif kind == "task_placed":
            self._placed(env.task_placed, at)
        elif kind in ("job_submitted", "job_admitted", "job_updated"):
            payload = getattr(env, kind)
            job = self._jobs.setdefault(payload.job_id, _Job())
            if kind == "job_submitted":
                job.submitted = at if job.submitted is None else min(job.submitted, at)
                if not job.allocation and payload.HasField("spec"):  # a claim: the
                    job.take(payload.spec, -math.inf)  # decision on it (admitted) replaces it
            elif payload.HasField("spec"):
                job.take(payload.spec, at)
        elif kind == "job_requeued":
            self._jobs.setdefault(env.job_requeued.job_id, _Job()).requeued.append(at)
        elif kind in _STOPS_WAITING:
            job = self._jobs.setdefault(getattr(env, kind).job_id, _Job())
            bisect.insort(job.stopped, at)
        self._folded += 1
        if self._folded % PRUNE_EVERY == 0:
            self._prune(self.now - self.window_s)

    def timeline(self, entitlements: Mapping[str, float]) -> Timeline:
        """The window ending at the log's clock, integrated (``entitlements``: each
        allocation's share of the cluster, as the console takes them from the tree); the
        one played last while it is less than ``REPLAY_EVERY_S`` of log time old."""
        shares = tuple(sorted(entitlements.items()))
        played = self._played
        if played is not None and played[0] == shares and self.now - played[1] < REPLAY_EVERY_S:
            return played[2]
        timeline = self._play(entitlements)
        self._played = (shares, self.now, timeline)
        return timeline

    @property
    def played_at(self) -> float:
        """The log time the figures ``timeline`` gives are of."""
        return self._played[1] if self._played is not None else self.now

    def _play(self, entitlements: Mapping[str, float]) -> Timeline:
        timeline = Timeline(self.window_s, points=1)
        if self._first > self.now:
            return timeline
        since = max(self.now - self.window_s, self._first)
        self._prune(since)
        play, started = _Play(), False
        changes = sorted(self._changes(), key=lambda change: change.at)
        for at, moment in groupby(changes, key=lambda change: change.at):
            if at > since and not started:  # the state at the window's start
                timeline.add(play.sample(since), entitlements)
                started = True
            for change in moment:
                play.apply(change)
            if at > since:
                timeline.add(play.sample(at), entitlements)
        if not started:
            timeline.add(play.sample(since), entitlements)
        timeline.add(play.sample(self.now), entitlements)
        return timeline

    # -- folding ---------------------------------------------------------------

    def _node_fact(self, fact: object, at: float) -> None:
        if isinstance(fact, events_pb2.NodeRegistered):
            gpus = Counter(gpu.type for gpu in fact.inventory.gpus)
            node = self._nodes.setdefault(fact.inventory.node_id, _Node())
            node.registrations.append((at, fact.incarnation, gpus))
        elif isinstance(fact, events_pb2.NodeLost):
            losses = self._nodes.setdefault(fact.node_id, _Node()).losses
            losses[fact.incarnation] = min(losses.get(fact.incarnation, at), at)
        elif isinstance(fact, events_pb2.ServingHeld | events_pb2.ServingReleased):
            # Placement's decisions, so in order: a hold ends where the next begins.
            gpu = (fact.node_id, fact.gpu_index)
            ending = self._serving_now.pop(gpu, None)
            if ending is not None:
                ending.until = at
            if isinstance(fact, events_pb2.ServingHeld):
                held = _Held(fact.allocation, True, 1, since=at)
                self._serving_now[gpu] = held
                self._serving.append(held)

    def _placed(self, placed: events_pb2.TaskPlaced, at: float) -> None:
        job = self._jobs.setdefault(placed.job_id, _Job())
        bisect.insort(job.stopped, at)
        if job.spec_at == -math.inf and not job.allocation and placed.HasField("spec"):
            job.take(placed.spec, -math.inf)  # a job whose submission the window left
        task = self._tasks.setdefault(placed.task_id, _Held())
        task.since = at
        if not placed.HasField("serving"):  # a workflow task's GPU is held by serving
            task.allocation, task.gpus = placed.spec.allocation, len(placed.gpu_indices)
            task.charged = job.charged if job.allocation else is_charged(placed.spec)

    def _changes(self) -> Iterator[_Change]:
        for node_id, node in self._nodes.items():
            for at, gpus in node.changes():
                yield _Change(at, node=node_id, gpus=gpus)
        for held in [*self._tasks.values(), *self._serving]:
            if held.since is not None and held.gpus:
                yield _Change(held.since, held=held, sign=1)
                if held.until is not None:
                    yield _Change(max(held.until, held.since), held=held, sign=-1)
        for job_id, job in self._jobs.items():
            if not job.allocation:
                continue  # nobody to owe
            for start, end in job.waits():
                yield _Change(start, job_id=job_id, job=job, sign=1)
                if end is not None:
                    yield _Change(end, job_id=job_id, job=job, sign=-1)

    def _prune(self, horizon: float) -> None:
        """Forget what ended before ``horizon`` (nodes stay: they are few). A task's end
        read before its placement is kept for it: the two are on different topics."""
        self._tasks = {
            task_id: held
            for task_id, held in self._tasks.items()
            if held.since is None or held.until is None or held.until >= horizon
        }
        self._serving = [h for h in self._serving if h.until is None or h.until >= horizon]
        self._jobs = {
            job_id: job
            for job_id, job in self._jobs.items()
            if not job.stopped
            or job.stopped[-1] >= horizon
            or any(end is None for _, end in job.waits())
        }


@dataclass(frozen=True)
class _Change:
    """One fact's effect at its moment ``at``: a node's GPUs by type (None: lost), a hold
    begun (``sign`` 1) or ended (-1), or a job that began or stopped waiting."""

    at: float
    node: str = ""
    gpus: Counter[str] | None = None
    held: _Held | None = None
    job_id: str = ""
    job: _Job | None = None
    sign: int = 0


@dataclass
class _Play:
    """The cluster as the facts have it at one moment. What waiting jobs ask is kept as
    they come and go, and counted afresh only when the nodes change (what the nodes up
    could give decides which waiting jobs are owed): a sample costs no walk of the queue."""

    nodes: dict[str, Counter[str]] = field(default_factory=dict)  # up: GPUs by type
    room: Counter[str] = field(default_factory=Counter)  # the nodes' GPUs, by type
    held: Counter[str] = field(default_factory=Counter)  # charged GPUs, by allocation
    held_free: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)  # job id -> waits open
    jobs: dict[str, _Job] = field(default_factory=dict)
    asked: Counter[str] = field(default_factory=Counter)  # owed GPUs waiting, by allocation

    def apply(self, change: _Change) -> None:
        if change.held is not None:
            held = change.held
            into = self.held if held.charged else self.held_free
            into[held.allocation] += change.sign * held.gpus
        elif change.job is not None:
            job_id, job = change.job_id, change.job
            before = self._asks(job_id)
            self.waiting[job_id] += change.sign
            self.jobs[job_id] = job
            self.asked[job.allocation] += (self._asks(job_id) - before) * job.gpus
            if not self.waiting[job_id]:  # only the jobs waiting now are kept
                del self.waiting[job_id], self.jobs[job_id]
        else:
            self.room.subtract(self.nodes.pop(change.node, Counter()))
            if change.gpus is not None:
                self.nodes[change.node] = change.gpus
                self.room.update(change.gpus)
            self.asked = Counter()
            for job_id in self.waiting:
                job = self.jobs[job_id]
                self.asked[job.allocation] += self._asks(job_id) * job.gpus

    def _asks(self, job_id: str) -> bool:
        """Whether the job waits now, charged, for what the nodes up could give it."""
        job = self.jobs.get(job_id)
        return (
            job is not None
            and self.waiting[job_id] > 0
            and job.charged
            and could_place(job.gpus, job.gpu_type, self.room, self.room.total())
        )

    def sample(self, at: float) -> Sample:
        # Only what the integrals read: capacity by type, and GPUs by allocation.
        by_type = {gpu_type: Gpus(capacity=gpus) for gpu_type, gpus in (+self.room).items()}
        return Sample(at, by_type, dict(+self.held), dict(+self.asked), dict(+self.held_free))


def service_levels(
    ledger: DeliveryLedger, entitlements: Mapping[str, float], scope: Scope | None
) -> budget_service_pb2.GetUsageResponse:
    """The window's owed and delivered GPU-hours of the allocations ``scope`` covers (all
    when None), as the console cuts them (``libs.readmodels.dashboard``)."""
    timeline = ledger.timeline(entitlements)
    reply = budget_service_pb2.GetUsageResponse(
        window=duration(ledger.window_s),
        covered=duration(timeline.span_s),
        target_pct=TARGET_DELIVERED_PCT,
    )
    reply.as_of.FromNanoseconds(round(ledger.played_at * 1e9))
    accounts = timeline.accounts()
    names = [  # each, even before any record
        name
        for name in sorted(accounts.keys() | entitlements.keys())
        if scope is None or name in scope.allocations
    ]
    capacity = timeline.capacity_gpu_s
    listed = [accounts.get(name, Account()) for name in names]
    for name, account in zip(names, listed, strict=True):
        level = reply.allocations.add(
            allocation=name,
            entitlement=entitlements.get(name, 0.0),
            owed_gpu_hours=account.owed / 3600,
            allocated_gpu_hours=account.delivered / 3600,
            unallocated_gpu_hours=account.free / 3600,
            small=small_team(account.owed, capacity),
        )
        if account.delivered_pct is not None:
            level.delivered_pct = account.delivered_pct
    reply.headline.CopyFrom(_headline(timeline.headline(listed)))
    return reply


def _headline(h: Headline) -> budget_service_pb2.ServiceHeadline:
    small = budget_service_pb2.SmallTeams(
        count=h.small_teams.count, owed_pct=h.small_teams.owed_pct, min_pct=h.small_teams.min_pct
    )
    return budget_service_pb2.ServiceHeadline(
        owed_delivered_min_pct=h.min_pct,
        owed_delivered_weighted_pct=h.weighted_pct,
        owed_small_teams=small,
    )
