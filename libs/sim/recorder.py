"""What a simulation measured: a recorder the driver updates, and the numbers it yields.

All integrals run over the measurement window [start, end] and are kept
exactly (the state is constant between events), in GPU-seconds; job
statistics cover the jobs submitted in the window.

* Occupancy: GPU-seconds held by any task (stopping ones included) over
  capacity × window.
* Owed and delivered, per allocation (a leaf of the budget tree) with
  entitlement e (its share of the cluster) and capacity C: its *demand* at a
  moment is the GPUs its charged work (minimum runtime > 0) holds plus the
  GPUs its charged waiting work asks for (a job larger than the cluster could
  ever run is not counted: no scheduler could have served it). It is *owed* min(e·C, demand) at
  every moment, and *delivered* the GPUs its charged work holds. Free
  (unallocated) work is neither owed nor delivered; it is reported apart.
  The headline (``libs.core.service_level.headline``) is the worst delivered ÷
  owed over the allocations owed at least 0.1 % of the cluster's GPU-time, over
  the window and per day of it (the floor taken per day); the smaller ones are
  reported apart (``owed_small_teams``), and Σ min(delivered, owed) ÷ Σ owed over
  everyone beside it (``owed_delivered_weighted_pct``). An allocation has *enough
  demand* when its demand is at least e·C for at least ``enough_demand``
  (default half) of the window; the minimum over those alone is kept too, as
  a figure that can hide a team with little demand.
* Lost work: GPU-seconds a preemption threw away, counted when the job
  restarts or is given up (``libs.sim.batch`` models the checkpoints).
* Sizes: jobs by GPU count (``SIZES``), counting only those the cluster could
  ever run (enough GPUs of their type); start rates also by work class.
* Queue wait: from submission to the first start. A job still waiting at the
  end counts with its wait so far, so a policy cannot look good by starving.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from libs.core.config import DAY
from libs.core.model import JobSpec, NodeSpec, WorkClass
from libs.core.service_level import (
    SmallTeams,
    could_place,
    headline,
    owed_gpus,
    slowdown,
    small_team,
)
from libs.sim.batch import (
    CANCELLED,
    PLACING,
    REJECTED,
    RUNNING,
    STOPPED,
    STOPPING,
    WAITING,
    Job,
    Observer,
)

CLASSES = tuple(c.value for c in WorkClass)
_SHOWN = {PLACING: RUNNING, STOPPING: STOPPED}  # a job's state as its outcome
SIZES = ("1", "2-8", "9-64", ">64")  # GPUs a job asks for


def gpus_of_type(nodes: Iterable[NodeSpec]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for node in nodes:
        totals[node.gpu_type] += node.gpu_count
    return dict(totals)


def size_class(gpus: int) -> str:
    return "1" if gpus <= 1 else "2-8" if gpus <= 8 else "9-64" if gpus <= 64 else ">64"


@dataclass(frozen=True)
class Distribution:
    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    percentiles: tuple[float, ...]  # 0th to 100th, for CDF plots

    @staticmethod
    def of(values: Sequence[float]) -> Distribution:
        if not values:
            return Distribution(0, 0.0, 0.0, 0.0, 0.0, ())
        # numpy's default: linear interpolation between the closest ranks.
        every = tuple(float(p) for p in np.percentile(values, range(101)))
        return Distribution(
            count=len(values),
            p50=every[50],
            p90=every[90],
            p99=every[99],
            mean=float(np.mean(values)),
            percentiles=every,
        )


@dataclass(frozen=True)
class AllocationMetrics:
    name: str
    entitlement: float  # share of the cluster
    owed_gpu_h: float
    delivered_gpu_h: float
    free_gpu_h: float  # unallocated work it ran, uncharged
    demand_fraction: float  # of the window with demand >= entitlement
    enough_demand: bool
    owed_gpu_h_by_day: tuple[float, ...]  # per day of the window, the last one maybe short
    delivered_gpu_h_by_day: tuple[float, ...]
    small_team: bool  # owed something, under the headline's floor (``service_level``)

    @property
    def delivered_pct(self) -> float | None:
        return _pct(self.delivered_gpu_h, self.owed_gpu_h)

    @property
    def delivered_pct_by_day(self) -> tuple[float | None, ...]:
        return tuple(map(_pct, self.delivered_gpu_h_by_day, self.owed_gpu_h_by_day))


def _pct(part: float, whole: float) -> float | None:
    return 100 * part / whole if whole > 0 else None


def _started_pct(jobs: Sequence[Job]) -> float | None:
    return _pct(sum(j.first_start is not None for j in jobs), len(jobs))


@dataclass(frozen=True)
class Series:
    """Sampled every ``step_s`` from the window's start, for plots."""

    step_s: float
    busy: dict[str, list[int]]  # work class -> GPUs held
    waiting_gpus: list[int]
    preemptions: list[int]  # cumulative


@dataclass(frozen=True)
class Unstarted:
    """A job over 64 GPUs that the cluster could run but that never started: when it
    asked, for what, and what it would have cost. ``entitled_gpus``: its team's share of
    the cluster, the most the team is ever owed. ``ahead_gpu_h``: the work its team had
    queued before it in the team's own order (same class, priority at least its own,
    submitted earlier) that had not started when it asked and that the cluster could
    run, GPUs × run time (a lower bound: work requeued later is not counted); beside
    ``entitled_gpus`` × ``waited_s`` it says whether the team's share could run that work
    before the run ended. "Before it" is ``queues.Waiting.key``'s order, of the jobs
    there when it asked."""

    job_id: str
    allocation: str
    gpus: int
    submitted_s: float  # after the window's start
    waited_s: float  # until the run's end
    gpu_h: float  # its GPUs × its run time
    entitled_gpus: float
    ahead_gpu_h: float


@dataclass(frozen=True)
class Metrics:
    policy: str
    start: float
    end: float
    capacity: int
    occupancy_pct: float
    # Occupancy against what could be held: min(capacity, held + asked for).
    occupancy_of_demand_pct: float
    owed_delivered_min_pct: float | None  # over the allocations at the floor or above
    owed_delivered_min_pct_by_day: tuple[float | None, ...]  # the floor taken per day
    owed_delivered_weighted_pct: float | None  # over every allocation
    owed_small_teams: SmallTeams  # those under the floor
    owed_delivered_min_enough_demand_pct: float | None  # over those with enough demand
    allocations: tuple[AllocationMetrics, ...]
    waits: dict[str, Distribution]  # by work class, and "all"
    jct: dict[str, Distribution]
    slowdown: dict[str, Distribution]  # JCT / max(runtime, 10 s)
    jobs: dict[str, int]  # outcome -> count
    preemptions: dict[str, int]  # work class of the stopped job -> count
    requeues: int
    lost_gpu_h: float  # work thrown away by preemptions
    lost_gpu_h_pct: float  # of capacity × window
    started_pct_by_size: dict[str, float | None]  # of the jobs that fit the cluster
    # The same by work class: the classes mix differently at each size (debug work, which
    # starts first, is at most two GPUs), so the size figures alone can mislead.
    started_pct_by_size_and_class: dict[str, dict[str, float | None]]
    waits_by_size: dict[str, Distribution]  # the same jobs
    large_never_started: tuple[Unstarted, ...]  # of those over 64 GPUs, by submission
    inputs: int  # fed to the policy
    series: Series
    sim_wall_s: float = 0.0  # set by whoever timed the run
    sim_cpu_s: float = 0.0  # the same, in CPU time: what a busy machine does not inflate

    @property
    def total_preemptions(self) -> int:
        return sum(self.preemptions.values())


@dataclass
class _Account:
    entitled_gpus: float
    owed_days: list[float]  # GPU-seconds per day of the window
    delivered_days: list[float]
    held: int = 0  # charged GPUs held
    asked: int = 0  # charged GPUs waiting
    held_free: int = 0
    since: float = 0.0
    owed: float = 0.0
    delivered: float = 0.0
    free: float = 0.0
    demand_s: float = 0.0


@dataclass(eq=False)
class Recorder(Observer):
    """What the batch agents count over the window [start, end], integrated as time moves."""

    capacity: int
    entitlements: Mapping[str, float]
    start: float
    end: float
    sample_s: float = 600.0
    enough_demand: float = 0.5
    # GPUs of each type, for which jobs the cluster could ever run; a job of no type
    # fits in ``capacity``.
    gpus_of_type: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._days = max(1, math.ceil((self.end - self.start) / DAY))
        self._requeues = 0
        self._lost_gpu_s = 0.0
        self._measuring = False  # counts start with the window, like the integrals
        self._now = self.start
        self._busy = dict.fromkeys(CLASSES, 0)
        self._waiting = 0
        self._busy_area = 0.0
        self._demand_area = 0.0
        self._accounts = {
            name: self._new_account(share * self.capacity)
            for name, share in sorted(self.entitlements.items())
        }
        self._preemptions = dict.fromkeys(CLASSES, 0)
        self._next_sample = self.start
        self._series = Series(self.sample_s, {c: [] for c in CLASSES}, [], [])

    def advance(self, t: float) -> None:
        """Time moves to ``t``; the state held since the last change is integrated."""
        self._measuring = self.start <= t <= self.end
        t = min(t, self.end)
        if t <= self._now:
            return
        while self._next_sample <= t:
            self._sample()
        held = sum(self._busy.values())
        dt = t - self._now
        self._busy_area += held * dt
        self._demand_area += min(self.capacity, held + self._waiting) * dt
        self._now = t

    def waiting(self, spec: JobSpec, delta: int) -> None:
        if not self._fits(spec):  # no placement on this cluster could serve it: not demand
            return
        self._waiting += delta * spec.gpus
        if spec.allocated:
            self._account(spec.allocation).asked += delta * spec.gpus

    def held(self, spec: JobSpec, gpus: int) -> None:
        """``gpus`` (negative: released) of a task of ``spec``, at the current time."""
        self._busy[spec.work_class.value] += gpus
        account = self._account(spec.allocation)
        if spec.allocated:
            account.held += gpus
        else:
            account.held_free += gpus

    def preempted(self, spec: JobSpec) -> None:
        if self._measuring:
            self._preemptions[spec.work_class.value] += 1

    def requeued(self) -> None:
        if self._measuring:
            self._requeues += 1

    def lost(self, gpu_s: float) -> None:
        """Work thrown away by a preemption: ``gpu_s`` since the job's last checkpoint."""
        if self._measuring:
            self._lost_gpu_s += gpu_s

    def finish(self, jobs: Iterable[Job], policy: str, inputs: int) -> Metrics:
        """The numbers, once the run is over; ``jobs``: every job submitted."""
        self.advance(self.end)
        for name in self._accounts:
            self._account(name)
        span = max(self.end - self.start, 1e-9)
        allocations = tuple(self._allocation(name, a, span) for name, a in self._accounts.items())
        enough = [a.delivered_pct for a in allocations if a.enough_demand]
        whole = headline(
            ((a.owed_gpu_h, a.delivered_gpu_h) for a in allocations), self.capacity * span / 3600
        )
        jobs = list(jobs)  # in submission order
        outcomes = [job for job in jobs if job.sim.at >= self.start]
        sized: dict[str, list[Job]] = {size: [] for size in SIZES}
        for job in outcomes:
            if self._fits(job.sim.spec):
                sized[size_class(job.sim.spec.gpus)].append(job)
        return Metrics(
            policy=policy,
            start=self.start,
            end=self.end,
            capacity=self.capacity,
            occupancy_pct=100 * self._busy_area / (self.capacity * span) if self.capacity else 0,
            occupancy_of_demand_pct=100 * self._busy_area / self._demand_area
            if self._demand_area
            else 100.0,
            owed_delivered_min_pct=whole.min_pct,
            owed_delivered_min_pct_by_day=tuple(
                headline(
                    (
                        (a.owed_gpu_h_by_day[day], a.delivered_gpu_h_by_day[day])
                        for a in allocations
                    ),
                    self.capacity * self._day_s(day) / 3600,
                ).min_pct
                for day in range(self._days)
            ),
            owed_delivered_weighted_pct=whole.weighted_pct,
            owed_small_teams=whole.small_teams,
            owed_delivered_min_enough_demand_pct=_least(enough),
            allocations=allocations,
            waits=_by_class(outcomes, lambda j: _wait(j, self.end)),
            jct=_by_class(outcomes, _jct),
            slowdown=_by_class(outcomes, _slowdown),
            jobs=dict(sorted(Counter(_SHOWN.get(j.state, j.state) for j in outcomes).items())),
            preemptions=dict(self._preemptions),
            requeues=self._requeues,
            lost_gpu_h=self._lost_gpu_s / 3600,
            lost_gpu_h_pct=100 * self._lost_gpu_s / (self.capacity * span) if self.capacity else 0,
            started_pct_by_size={size: _started_pct(js) for size, js in sized.items()},
            started_pct_by_size_and_class={
                c: {
                    size: _started_pct([j for j in js if j.sim.spec.work_class.value == c])
                    for size, js in sized.items()
                }
                for c in CLASSES
            },
            waits_by_size={
                size: Distribution.of([w for j in js if (w := _wait(j, self.end)) is not None])
                for size, js in sized.items()
            },
            large_never_started=self._unstarted(
                [job for job in sized[">64"] if job.first_start is None], jobs
            ),
            inputs=inputs,
            series=self._series,
        )

    def _unstarted(self, large: list[Job], jobs: list[Job]) -> tuple[Unstarted, ...]:
        """The large jobs that never started, each with the work queued before it."""
        if not large:
            return ()
        # Per team and class, its queue as columns: (position, priority, first start, GPU-h).
        rows: dict[tuple[str, str], list[tuple[int, int, float, float]]] = {}
        for i, job in enumerate(jobs):
            spec = job.sim.spec
            if self._fits(spec) and job.state not in (CANCELLED, REJECTED):
                started = math.inf if job.first_start is None else job.first_start
                rows.setdefault((spec.allocation, spec.work_class.value), []).append(
                    (i, spec.priority, started, spec.gpus * job.sim.runtime_s / 3600)
                )
        queues = {team: np.array(queue).T for team, queue in rows.items()}
        position = {id(job): i for i, job in enumerate(jobs)}
        unstarted = []
        for job in large:
            spec, asked = job.sim.spec, job.sim.at
            # (A cancelled job is not queued: its team may have no queue of its class.)
            seq, priority, started, work = queues.get(
                (spec.allocation, spec.work_class.value), np.empty((4, 0))
            )
            ahead = (seq < position[id(job)]) & (priority >= spec.priority) & (started > asked)
            unstarted.append(
                Unstarted(
                    job_id=job.sim.job_id,
                    allocation=spec.allocation,
                    gpus=spec.gpus,
                    submitted_s=asked - self.start,
                    waited_s=self.end - asked,
                    gpu_h=spec.gpus * job.sim.runtime_s / 3600,
                    entitled_gpus=self.entitlements.get(spec.allocation, 0.0) * self.capacity,
                    ahead_gpu_h=float(work[ahead].sum()),
                )
            )
        return tuple(unstarted)

    def _day_s(self, day: int) -> float:
        """How long day ``day`` of the window is (the last may be short)."""
        since = self.start + day * DAY
        return max(0.0, min(self.end, since + DAY) - since)

    def _new_account(self, entitled_gpus: float) -> _Account:
        return _Account(entitled_gpus, [0.0] * self._days, [0.0] * self._days, since=self._now)

    def _account(self, name: str) -> _Account:
        """The allocation's account, integrated up to now (unknown names are owed nothing)."""
        account = self._accounts.get(name)
        if account is None:
            account = self._accounts[name] = self._new_account(0.0)
        dt = self._now - account.since
        if dt > 0:
            demand = account.held + account.asked
            owed = owed_gpus(account.entitled_gpus, account.held, account.asked)
            account.owed += owed * dt
            account.delivered += account.held * dt
            account.free += account.held_free * dt
            if account.entitled_gpus > 0 and demand >= account.entitled_gpus:
                account.demand_s += dt
            if owed or account.held:
                self._by_day(account, owed)
            account.since = self._now
        return account

    def _by_day(self, account: _Account, owed: float) -> None:
        """The same integrals split by day of the window (kept apart from the whole-window
        sums, which stay exactly as they were)."""
        since = account.since
        while since < self._now:
            day = int((since - self.start) // DAY)
            until = min(self._now, self.start + (day + 1) * DAY)
            account.owed_days[day] += owed * (until - since)
            account.delivered_days[day] += account.held * (until - since)
            since = until

    def _fits(self, spec: JobSpec) -> bool:
        """Whether the cluster could ever run a job of ``spec``."""
        return could_place(spec.gpus, spec.gpu_type, self.gpus_of_type, self.capacity)

    def _allocation(self, name: str, account: _Account, span: float) -> AllocationMetrics:
        fraction = account.demand_s / span
        return AllocationMetrics(
            name=name,
            entitlement=self.entitlements.get(name, 0.0),
            owed_gpu_h=account.owed / 3600,
            delivered_gpu_h=account.delivered / 3600,
            free_gpu_h=account.free / 3600,
            demand_fraction=fraction,
            enough_demand=fraction >= self.enough_demand,
            owed_gpu_h_by_day=tuple(s / 3600 for s in account.owed_days),
            delivered_gpu_h_by_day=tuple(s / 3600 for s in account.delivered_days),
            small_team=small_team(account.owed, self.capacity * span),
        )

    def _sample(self) -> None:
        for work_class, held in self._busy.items():
            self._series.busy[work_class].append(held)
        self._series.waiting_gpus.append(self._waiting)
        self._series.preemptions.append(sum(self._preemptions.values()))
        self._next_sample += self._series.step_s


def _least(values: Iterable[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


def _wait(job: Job, end: float) -> float | None:
    if job.first_start is not None:
        return job.first_start - job.sim.at
    if job.state == WAITING:
        return end - job.sim.at  # still waiting: a lower bound
    return None  # cancelled or lost before it ever started


def _jct(job: Job) -> float | None:
    return None if job.finished is None else job.finished - job.sim.at


def _slowdown(job: Job) -> float | None:
    jct = _jct(job)
    return None if jct is None else slowdown(jct, job.sim.runtime_s)


def _by_class(jobs: list[Job], value: Callable[[Job], float | None]) -> dict[str, Distribution]:
    per: dict[str, list[float]] = {c: [] for c in CLASSES}
    every: list[float] = []
    for job in jobs:
        v = value(job)
        if v is not None:
            per[job.sim.spec.work_class.value].append(v)
            every.append(v)
    return {**{c: Distribution.of(vs) for c, vs in per.items()}, "all": Distribution.of(every)}
