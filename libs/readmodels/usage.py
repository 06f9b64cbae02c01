"""The usage read model: each cluster's GPU-seconds per allocation over the lookback window.

Folded from the events topic in log order (a cluster's events are one
partition's, in order) with ``libs.core.usage``, so the projector charges what
the budget service and the simulator charge: an allocated task (minimum runtime
> 0) from its start to its end, once, and a GPU serving holds from placement's
``ServingHeld`` to its ``ServingReleased`` (a workflow's tasks are not charged on
their own: their GPUs are). Time is the log's own: a cluster's clock
is the latest ``occurred_at`` folded, and a snapshot is taken as of that clock,
so every snapshot is a function of the log prefix alone, whenever it is taken.

Only records the gate let through are folded (``libs.trust.gate``, called by whoever
feeds the ledger); the ledger keeps what the gate asks about nodes itself, folded in
log order from the records it let through: each node's approved key (``node_key``:
admission's ``node_approved`` and ``node_revoked``), and the node each running task
started on (``task_node``: its node's trusted ``task_started``). So the verdicts too are
a function of the log prefix, and a key revoked later does not unmake the charges of
the reports its node signed before.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import budget_service_pb2, events_pb2, types_pb2

from libs.core.approvals import ApprovedKey, approved, revoked
from libs.core.budget_tree import InvalidTree
from libs.core.ids import TaskId
from libs.core.usage import Usage, WindowedUsage
from libs.events import event_type, new_envelope, occurred_at
from libs.events.convert import node_from_proto, spec_from_proto, tree_from_proto
from libs.events.envelope import DEFAULT_CLUSTER, timestamp_seconds
from libs.events.wire_time import duration


@dataclass(frozen=True)
class _Contract:
    allocation: str
    gpus: int
    allocated: bool
    serving: bool  # a workflow: charged by the GPUs serving holds, not task by task


Price = Callable[[str], float]  # GPU type -> cost of one GPU-second


def _unit(gpu_type: str) -> float:
    return 1.0


class _Priced:
    """Pickled without its price (a function of the running projector's knobs): a
    snapshot keeps facts only; whoever loads one prices it with :meth:`UsageLedger.priced`."""

    _price: Price

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k != "_price"}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._price = _unit


class ClusterUsage(_Priced):
    """One cluster's usage and entitlements, and the last usage snapshot it published."""

    def __init__(self, cluster: str, window_s: float, price: Price = _unit) -> None:
        self.cluster = cluster
        self.window_s = window_s
        self._price = price
        self._node_types: dict[str, str] = {}  # what each node's GPU-seconds cost
        # What the gate in front of the fold asks: each node's approved key, and the
        # node each running task started on (see the module's notes).
        self._node_keys: dict[str, ApprovedKey] = {}
        self._task_nodes: dict[TaskId, str] = {}
        self._usage = WindowedUsage(window_s)
        self._jobs: dict[str, _Contract] = {}
        self._entitlements: dict[str, float] = {}
        self._clock = Timestamp()
        self._edge: int | None = None
        # Events folded (snapshots aside) and the latest one's id: the log
        # prefix a snapshot describes, for its id and its causation.
        self._folded = 0
        self._latest_event_id = ""
        self._last_snapshot: events_pb2.UsageSnapshot | None = None
        self._sent = False

    @property
    def now(self) -> float:
        """The cluster's clock: the latest event time folded, in seconds."""
        return timestamp_seconds(self._clock)

    def node_key(self, node_id: str) -> ApprovedKey | None:
        """The node's key as operators approved (or revoked) it, as folded so far; None:
        never approved."""
        return self._node_keys.get(node_id)

    def task_node(self, job_id: str, task_id: str) -> str | None:
        """The node a task started on, as folded so far, until that node reports its end;
        None when unknown.

        Its start's, not its placement's (placement's decisions are another topic, not
        ordered with this one): a node that reports a task start first, before the
        node it was placed on, is taken for the task's until it ends. Placement checks
        against the placement itself, and refuses such a start.
        """
        return self._task_nodes.get(TaskId(task_id))

    def apply(self, env: events_pb2.Envelope) -> None:
        """Fold one of this cluster's envelopes, in log order (only once the gate
        let it through)."""
        kind = event_type(env)
        if kind == "usage_snapshot":
            # What this process sent is newer than anything it reads back late.
            if not self._sent:
                self._last_snapshot = _copy(env.usage_snapshot)
            return
        self._folded += 1
        self._latest_event_id = env.event_id
        self._advance(env.occurred_at)
        at = occurred_at(env)
        match kind:
            case "job_admitted":
                spec = env.job_admitted.spec
                self._jobs[env.job_admitted.job_id] = _Contract(
                    spec.allocation,
                    spec.gpus,
                    allocated=spec_from_proto(spec).allocated,  # the core's rule
                    serving=spec.HasField("workflow"),
                )
            case "task_started":
                started = env.task_started
                self._task_nodes.setdefault(TaskId(started.task_id), started.node_id)
                # A task of a job never admitted here has nobody to charge.
                contract = self._jobs.get(started.job_id)
                if contract is not None and not contract.serving:
                    self._usage.start(
                        TaskId(started.task_id),
                        contract.allocation,
                        contract.gpus,
                        allocated=contract.allocated,
                        at=at,
                        price=self._price(self._node_types.get(started.node_id, "")),
                    )
            case "node_registered":
                node = node_from_proto(env.node_registered.inventory)
                self._node_types[node.node_id] = node.gpu_type
            case "task_finished":
                self._task_nodes.pop(TaskId(env.task_finished.task_id), None)
                self._usage.end(TaskId(env.task_finished.task_id), at)
            case "task_failed":
                self._task_nodes.pop(TaskId(env.task_failed.task_id), None)
                self._usage.end(TaskId(env.task_failed.task_id), at)
            case "node_approved" if key := approved(env.node_approved.public_key):
                self._node_keys[env.node_approved.node_id] = key
            case "node_revoked" if key := revoked(self._node_keys.get(env.node_revoked.node_id)):
                self._node_keys[env.node_revoked.node_id] = key
            case "budget_changed":
                # The budget service validates; a bad tree here keeps the last good one.
                with contextlib.suppress(InvalidTree):
                    self._entitlements = tree_from_proto(env.budget_changed.tree).entitlements()

    def lost(self, gone: events_pb2.TaskLost, at: float) -> None:
        """Placement's word that a task ended with its node, which no agent will
        report: it is charged up to then."""
        self._usage.end(TaskId(gone.task_id), at)

    def serving(
        self, change: events_pb2.ServingHeld | events_pb2.ServingReleased, at: float
    ) -> None:
        """Placement's word that serving holds a GPU for an allocation (charged from
        ``at``), or gave it back (charged up to ``at``)."""
        gpu = (change.node_id, change.gpu_index)
        if isinstance(change, events_pb2.ServingHeld):
            price = self._price(self._node_types.get(change.node_id, ""))
            self._usage.hold(gpu, change.allocation, at=at, price=price)
        else:
            self._usage.release(gpu, at)

    def usage(self) -> dict[str, Usage]:
        """Usage per allocation over the window ending at the clock, sorted by allocation."""
        return self._usage.snapshot(self.now) if self._folded else {}

    def snapshot(self) -> events_pb2.UsageSnapshot:
        return events_pb2.UsageSnapshot(
            window=duration(self.window_s),
            usage=[
                types_pb2.AllocationUsage(
                    allocation=allocation,
                    allocated_gpu_s=usage.allocated_gpu_s,
                    unallocated_gpu_s=usage.unallocated_gpu_s,
                )
                for allocation, usage in self.usage().items()
            ],
        )

    def balances(self) -> budget_service_pb2.GetBalancesResponse:
        """Charged GPU-seconds and entitlement of every allocation either is known for."""
        usage = self.usage()
        return budget_service_pb2.GetBalancesResponse(
            balances=[
                budget_service_pb2.Balance(
                    allocation=allocation,
                    entitlement=self._entitlements.get(allocation, 0.0),
                    gpu_seconds=usage[allocation].allocated_gpu_s if allocation in usage else 0.0,
                )
                for allocation in sorted(self._entitlements.keys() | usage.keys())
            ]
        )

    def snapshot_due(self, producer: str) -> events_pb2.Envelope | None:
        """The snapshot envelope to publish; None when the last one says the same.

        Its time is the clock and its id names the prefix folded (and the
        window), so publishing the same prefix twice (a restart, a retry)
        repeats the same event, which consumers drop by its id.
        """
        snapshot = self.snapshot()
        # Before the first snapshot, no usage is what the scheduler assumes anyway.
        last = self._last_snapshot or events_pb2.UsageSnapshot(window=duration(self.window_s))
        if snapshot == last:
            return None
        env = new_envelope(
            snapshot,
            producer=producer,
            cluster=self.cluster,
            causation_id=self._latest_event_id,
            occurred=self._clock.ToDatetime(tzinfo=UTC),
            event_id=f"{self.cluster}-usage-{self._folded}-w{self.window_s:g}",
        )
        env.occurred_at.CopyFrom(self._clock)  # with the nanoseconds a datetime drops
        return env

    def sent(self, snapshot: events_pb2.UsageSnapshot) -> None:
        """Record a snapshot as published, so an unchanged one is not sent again."""
        self._last_snapshot = _copy(snapshot)
        self._sent = True

    def _advance(self, at: Timestamp) -> None:
        if (at.seconds, at.nanos) <= (self._clock.seconds, self._clock.nanos):
            return
        self._clock.CopyFrom(at)
        # Expire as soon as the window's trailing edge enters a new bucket, at a
        # point the log fixes: left to whenever a snapshot is asked for, the
        # order of charges and expiries, and so the float sums, would vary.
        edge = math.floor((self.now - self.window_s) / self._usage.bucket_s)
        if edge != self._edge:
            self._edge = edge
            self._usage.snapshot(self.now)


class UsageLedger(_Priced):
    """Every cluster's usage, folded from the events topic."""

    def __init__(self, window_s: float, price: Price = _unit) -> None:
        self.window_s = window_s
        self._price = price
        self._clusters: dict[str, ClusterUsage] = {}

    def apply(self, env: events_pb2.Envelope) -> None:
        name = env.cluster or DEFAULT_CLUSTER
        cluster = self._clusters.get(name)
        if cluster is None:
            cluster = self._clusters[name] = ClusterUsage(name, self.window_s, self._price)
        cluster.apply(env)

    def node_key(self, cluster: str, node_id: str) -> ApprovedKey | None:
        """A node's approved key in ``cluster`` (see ``ClusterUsage.node_key``)."""
        usage = self.cluster(cluster)
        return usage.node_key(node_id) if usage is not None else None

    def task_node(self, cluster: str, job_id: str, task_id: str) -> str | None:
        """The node a task of ``cluster`` runs on (see ``ClusterUsage.task_node``)."""
        usage = self.cluster(cluster)
        return usage.task_node(job_id, task_id) if usage is not None else None

    def decided(self, env: events_pb2.Envelope) -> None:
        """Fold one of placement's decisions: a lost task, and serving's GPUs held and
        given back, change what is charged. Decisions are not the events log, so they
        leave its clock and prefix alone."""
        kind = event_type(env)
        if kind not in ("task_lost", "serving_held", "serving_released"):
            return
        cluster = self._clusters.get(env.cluster or DEFAULT_CLUSTER)
        if cluster is None:
            return
        if kind == "task_lost":
            cluster.lost(env.task_lost, occurred_at(env))
        else:
            cluster.serving(getattr(env, kind), occurred_at(env))

    def cluster(self, name: str) -> ClusterUsage | None:
        return self._clusters.get(name or DEFAULT_CLUSTER)

    def priced(self, price: Price) -> None:
        """Charge GPU-seconds at ``price`` from now on (a ledger loaded from a snapshot)."""
        self._price = price
        for cluster in self._clusters.values():
            cluster._price = price

    def clusters(self) -> list[ClusterUsage]:
        """Every cluster's usage, by cluster name."""
        return [self._clusters[name] for name in sorted(self._clusters)]

    def snapshots_due(self, producer: str) -> list[events_pb2.Envelope]:
        """A snapshot for each cluster whose usage changed since its last one, by cluster."""
        due = (self._clusters[name].snapshot_due(producer) for name in sorted(self._clusters))
        return [env for env in due if env is not None]

    def sent(self, env: events_pb2.Envelope) -> None:
        """Record a snapshot envelope from ``snapshots_due`` as published."""
        self._clusters[env.cluster].sent(env.usage_snapshot)


def _copy(snapshot: events_pb2.UsageSnapshot) -> events_pb2.UsageSnapshot:
    copy = events_pb2.UsageSnapshot()
    copy.CopyFrom(snapshot)
    return copy
