"""The cluster's occupancy over time, and each allocation's owed and delivered GPUs.

Pure: the console samples the projector's node and job views (``sample``), GPUs counted
by type (a cluster mixes types, simulated serving nodes among real ones: a total alone
describes neither), and feeds each sample to a ``Timeline``, which integrates the state
held since the previous sample (as the simulator's recorder does between events) with
``libs.core.service_level``'s definitions: owed is ``min(entitlement x capacity, held +
asked)`` of charged work, delivered is what charged work holds, free (unallocated) work is
counted apart. The integrals slide over the lookback window in buckets of 1/``BUCKETS`` of
it. A timeline starts from the jobs' history (``history``: when each job the job view
holds waited and ran, on today's nodes), so that it covers the window from its first
sample on.

The projector's metrics count the same samples, one per cluster (``by_cluster``): GPUs
by state (``Gpus.states``), and each allocation's waiting jobs and demand, so that
Prometheus and the console cannot disagree.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import astuple, dataclass, field
from typing import NamedTuple

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import types_pb2

from libs.core.service_level import (
    Asking,
    Headline,
    Occupancy,
    could_place,
    gpu_states,
    headline,
    owed_gpus,
    waiting_and_asked,
)
from libs.events.convert import spec_from_proto
from libs.events.envelope import DEFAULT_CLUSTER, timestamp_seconds
from libs.readmodels.job_state import WAITING

BUCKETS = 200
POINTS = 1800  # occupancy points kept for the chart


def is_charged(spec: types_pb2.JobSpec) -> bool:
    """Allocated work: the core's rule, as the usage ledger applies it."""
    return spec_from_proto(spec).allocated


@dataclass(frozen=True)
class Gpus:
    """GPUs of one type (or of all) at one moment."""

    capacity: int = 0  # on nodes not lost
    busy: int = 0  # of those, held by tasks or workflow serving
    idle: int = 0  # of the busy ones, those whose job last reported them idle, or serving's
    # with no task running
    warm: int = 0  # of the idle ones, serving's with no task running
    lost: int = 0  # on lost nodes
    lost_held: int = 0  # of those, still held by tasks or serving (leaked)

    def __add__(self, other: Gpus) -> Gpus:
        return Gpus(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def states(self) -> dict[str, int]:
        """Every GPU in one state (``service_level.gpu_states``)."""
        return gpu_states(self.capacity, self.busy, self.idle, self.warm, self.lost)


@dataclass(frozen=True)
class Sample:
    """The cluster at one moment (seconds since the epoch)."""

    at: float
    by_type: Mapping[str, Gpus]  # GPUs by type
    held: Mapping[str, int] = field(default_factory=dict)  # charged GPUs held, by allocation
    asked: Mapping[str, int] = field(default_factory=dict)  # charged GPUs waiting
    held_free: Mapping[str, int] = field(default_factory=dict)  # unallocated GPUs held
    waiting: Mapping[str, int] = field(default_factory=dict)  # jobs waiting, any kind

    def occupancy(self) -> Occupancy:
        """The sample as the service levels count it (what the core's ``occupancy`` says too)."""
        total = self.total
        return Occupancy(total.capacity, total.busy, self.waiting, self.held, self.asked)

    @property
    def total(self) -> Gpus:
        return sum(self.by_type.values(), Gpus())

    @property
    def capacity(self) -> int:
        return self.total.capacity


class Holding(NamedTuple):
    """GPUs of one type on one node held by one task, or one GPU workflow serving holds."""

    allocation: str | None  # None: a task of a job the job view does not hold
    charged: bool
    gpus: int
    idle: int  # of those: the job last reported them idle, or serving runs nothing there
    gpu_type: str
    serving: bool = False  # a GPU workflow serving holds


def holdings(node: types_pb2.Node, jobs: Mapping[str, types_pb2.Job]) -> Iterator[Holding]:
    """Who holds the node's GPUs. A GPU serving holds is held for its allocation, busy or
    idle (it is charged so), and counted once: not again for the workflow task on it."""
    types = {gpu.index: gpu.type for gpu in node.inventory.gpus}
    serving = {gpu.gpu_index: gpu.allocation for gpu in node.serving}
    running: set[int] = set()
    for task in node.running:
        running.update(task.gpu_indices)
        by_type = Counter(types.get(i, "") for i in task.gpu_indices if i not in serving)
        job = jobs.get(task.job_id)
        for gpu_type, count in sorted(by_type.items()):
            if job is None:
                yield Holding(None, False, count, 0, gpu_type)
            else:
                idle = count if job.idle else 0
                yield Holding(job.spec.allocation, is_charged(job.spec), count, idle, gpu_type)
    for index, allocation in serving.items():
        yield Holding(allocation, True, 1, int(index not in running), types.get(index, ""), True)


def sample(at: float, nodes: Iterable[types_pb2.Node], jobs: Iterable[types_pb2.Job]) -> Sample:
    """``nodes`` as the projector lists them (ended tasks left out), ``jobs`` every job.

    A waiting job larger than any placement the cluster could give it is no demand (as in
    the simulator: no scheduler could serve it)."""
    by_id = {job.job_id: job for job in jobs}
    by_type: dict[str, Gpus] = {}
    held: dict[str, int] = {}
    held_free: dict[str, int] = {}
    for node in nodes:
        for gpu in node.inventory.gpus:
            counted = Gpus(lost=1) if node.lost else Gpus(capacity=1)
            by_type[gpu.type] = by_type.get(gpu.type, Gpus()) + counted
        for holding in holdings(node, by_id):
            if node.lost:
                counted = Gpus(lost_held=holding.gpus)
            else:
                warm = holding.idle if holding.serving else 0
                counted = Gpus(busy=holding.gpus, idle=holding.idle, warm=warm)
            by_type[holding.gpu_type] = by_type.get(holding.gpu_type, Gpus()) + counted
            if holding.allocation is not None and not node.lost:
                into = held if holding.charged else held_free
                into[holding.allocation] = into.get(holding.allocation, 0) + holding.gpus
    room = {gpu_type: gpus.capacity for gpu_type, gpus in by_type.items()}
    waiting, asked = waiting_and_asked(
        (
            Asking(job.spec.allocation, is_charged(job.spec), job.spec.gpus, job.spec.gpu_type)
            for job in by_id.values()
            if job.state in WAITING
        ),
        room,
    )
    return Sample(at, by_type, held, asked, held_free, waiting)


def by_cluster(
    at: float, nodes: Iterable[types_pb2.Node], jobs: Iterable[types_pb2.Job]
) -> dict[str, Sample]:
    """One ``sample`` per cluster, of its nodes and the jobs that name it (or none, the
    default cluster): what the projector's metrics report."""
    nodes_of: dict[str, list[types_pb2.Node]] = {}
    jobs_of: dict[str, list[types_pb2.Job]] = {}
    for node in nodes:
        nodes_of.setdefault(node.inventory.cluster or DEFAULT_CLUSTER, []).append(node)
    for job in jobs:
        jobs_of.setdefault(job.spec.cluster or DEFAULT_CLUSTER, []).append(job)
    return {
        cluster: sample(at, nodes_of.get(cluster, ()), jobs_of.get(cluster, ()))
        for cluster in sorted(nodes_of.keys() | jobs_of.keys())
    }


def history(
    jobs: Iterable[types_pb2.Job], nodes: Iterable[types_pb2.Node], since: float, now: float
) -> list[Sample]:
    """Samples at each moment between ``since`` and ``now`` that a job began to wait, began
    to run or ended, from the jobs' times (their latest attempt's), on today's ``nodes``:
    a job's GPUs are of its node's type (else of the type it asked for)."""
    nodes = list(nodes)
    room = {t: gpus.capacity for t, gpus in sample(now, nodes, ()).by_type.items()}
    node_types = {n.inventory.node_id: n.inventory.gpus[0].type for n in nodes if n.inventory.gpus}
    # (at, which, key, GPUs + or -): the key is an allocation, or for "busy" a GPU type.
    steps: list[tuple[float, str, str, int]] = []
    for job in jobs:
        spec = job.spec
        submitted, started, ended = (moment(t) for t in (job.submitted_at, job.started_at,
                                                      job.finished_at))  # fmt: skip
        if submitted is None or spec.gpus < 1:
            continue
        charged = is_charged(spec)
        waited_until = started or ended or now
        if charged and could_place(spec.gpus, spec.gpu_type, room, sum(room.values())):
            steps += [(submitted, "asked", spec.allocation, spec.gpus),
                      (waited_until, "asked", spec.allocation, -spec.gpus)]  # fmt: skip
        if started is not None:
            which = "held" if charged else "held_free"
            gpu_type = node_types.get(job.node_id, spec.gpu_type)
            for key, name in ((which, spec.allocation), ("busy", gpu_type)):
                steps += [(started, key, name, spec.gpus), (ended or now, key, name, -spec.gpus)]
    state: dict[str, dict[str, int]] = {"held": {}, "asked": {}, "held_free": {}, "busy": {}}
    samples: list[Sample] = []
    for at, which, key, gpus in sorted(steps):
        counts = state[which]
        counts[key] = counts.get(key, 0) + gpus
        if since <= at < now:
            busy = {t: n for t, n in state["busy"].items() if n}
            point = Sample(max(at, since),
                           {t: Gpus(room.get(t, 0), busy.get(t, 0)) for t in room.keys() | busy},
                           {a: n for a, n in state["held"].items() if n},
                           {a: n for a, n in state["asked"].items() if n},
                           {a: n for a, n in state["held_free"].items() if n})  # fmt: skip
            if samples and samples[-1].at == point.at:
                samples[-1] = point  # several changes at one moment: the state after all
            else:
                samples.append(point)
    return samples


def moment(ts: Timestamp) -> float | None:
    """A read model's time in seconds since the epoch; None when it is not set."""
    return timestamp_seconds(ts) if ts.seconds or ts.nanos else None


@dataclass
class Account:
    """GPU-seconds of one allocation over a stretch of time."""

    owed: float = 0.0
    delivered: float = 0.0
    free: float = 0.0

    def add(self, other: Account) -> None:
        self.owed += other.owed
        self.delivered += other.delivered
        self.free += other.free

    @property
    def delivered_pct(self) -> float | None:
        """Delivered as a percentage of owed; None when nothing was owed."""
        return 100 * self.delivered / self.owed if self.owed > 0 else None


@dataclass
class _Bucket:
    start: float
    accounts: dict[str, Account] = field(default_factory=dict)
    capacity: float = 0.0  # GPU-seconds of the nodes up


class Timeline:
    """Samples in time order; ``entitlements``: each allocation's share of the cluster."""

    def __init__(self, window_s: float, points: int = POINTS) -> None:
        self.window_s = window_s
        self._bucket_s = window_s / BUCKETS
        self._buckets: deque[_Bucket] = deque()
        self._points: deque[Sample] = deque(maxlen=points)
        self._last: Sample | None = None
        self._entitled: dict[str, float] = {}
        self._first_at: float | None = None

    def add(self, now: Sample, entitlements: Mapping[str, float]) -> None:
        """Integrate the state of the previous sample up to ``now``, then hold ``now``'s.

        A sample not after the previous one replaces nothing (a clock step back)."""
        last = self._last
        if last is not None and now.at <= last.at:
            return
        if last is not None:
            self._integrate(last, now.at)
        else:
            self._first_at = now.at
        self._last = now
        self._entitled = {a: share * now.capacity for a, share in entitlements.items()}
        self._points.append(now)
        self._expire(now.at)

    def points(self) -> list[Sample]:
        """The latest samples, oldest first."""
        return list(self._points)

    def accounts(self) -> dict[str, Account]:
        """Owed, delivered and free GPU-seconds by allocation over the window (as far as
        the timeline has seen), sorted by allocation; every entitled allocation is listed."""
        total: dict[str, Account] = {name: Account() for name in self._entitled}
        for bucket in self._buckets:
            for name, account in bucket.accounts.items():
                total.setdefault(name, Account()).add(account)
        return dict(sorted(total.items()))

    def headline(self, accounts: Iterable[Account]) -> Headline:
        """The service-level headline (``libs.core.service_level.headline``) over these
        of ``accounts()``, against the cluster's GPU-seconds over the same stretch."""
        return headline(((a.owed, a.delivered) for a in accounts), self.capacity_gpu_s)

    @property
    def capacity_gpu_s(self) -> float:
        """The GPU-seconds of the nodes up over the window (as far as the timeline has
        seen): what a small team's floor is a share of."""
        return sum(bucket.capacity for bucket in self._buckets)

    @property
    def span_s(self) -> float:
        """How much of the window the accounts cover."""
        if self._last is None or self._first_at is None:
            return 0.0
        return min(self._last.at - self._first_at, self.window_s)

    def _integrate(self, state: Sample, until: float) -> None:
        since = state.at
        while since < until:
            bucket = self._bucket(since)
            end = min(until, bucket.start + self._bucket_s)
            dt = end - since
            bucket.capacity += state.capacity * dt
            for name in self._entitled.keys() | state.held.keys() | state.asked.keys():
                held, asked = state.held.get(name, 0), state.asked.get(name, 0)
                account = bucket.accounts.setdefault(name, Account())
                account.owed += owed_gpus(self._entitled.get(name, 0.0), held, asked) * dt
                account.delivered += held * dt
            for name, gpus in state.held_free.items():
                bucket.accounts.setdefault(name, Account()).free += gpus * dt
            since = end

    def _bucket(self, at: float) -> _Bucket:
        start = at - at % self._bucket_s
        if not self._buckets or self._buckets[-1].start < start:
            self._buckets.append(_Bucket(start))
        return self._buckets[-1]

    def _expire(self, now: float) -> None:
        # A bucket is dropped once it lies wholly before the window.
        while self._buckets and self._buckets[0].start + self._bucket_s <= now - self.window_s:
            self._buckets.popleft()
