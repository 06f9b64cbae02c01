"""Quartermaster's Prometheus metrics: every instrument, named once.

Services update these from state they have (a poll's positions, a batch's decisions,
the projector's views, counted by ``libs.readmodels.occupancy`` as the console counts
them); ``services.metrics_http`` serves them. Names follow
Prometheus' conventions: a ``qm_`` prefix, base units in the name, ``_total`` on counters.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiokafka.structs import TopicPartition
from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# No ``*_created`` series beside each counter and histogram: Prometheus has no use for them.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONSUMER_LAG = Gauge(
    "qm_consumer_lag_records",
    "Committed records of a partition this consumer has not read yet (end offset - position)",
    ["consumer", "topic", "partition"],
)
CONSUMER_LAST_POLL = Gauge(
    "qm_consumer_last_poll_timestamp_seconds",
    "When this consumer last polled (it polls at least every second while its loop runs)",
    ["consumer"],
)
DECISIONS = Counter(
    "qm_decisions",
    "Decisions placement committed to the decisions topic, by kind (rate(): decisions/s)",
    ["kind"],
)
DECISION_SECONDS = Histogram(
    "qm_decision_seconds",
    "Time the core took to decide one input record (Scheduler.handle and encoding), by the "
    "input's kind",
    ["input"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
DECISION_DELAY_SECONDS = Histogram(
    "qm_decision_delay_seconds",
    "From an input record's occurred_at to the commit of the decisions it caused, by the "
    "input's kind",
    ["input"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
PLACEMENT_PARTITIONS = Gauge(
    "qm_placement_partitions",
    "Input partitions this placement instance decides (active) or keeps warm (standby)",
    ["role"],
)
STANDBY_BEHIND = Gauge(
    "qm_placement_standby_behind_records",
    "Records the group has committed that this instance's warm state of a partition it does "
    "not own has not folded yet (a takeover folds them first)",
    ["partition"],
)
SNAPSHOTS = Counter(
    "qm_placement_snapshots", "Snapshots placement wrote, by input partition", ["partition"]
)
GRPC_REQUESTS = Counter(
    "qm_grpc_requests", "gRPC calls this service answered, by method and status", ["method", "code"]
)
WAITING_JOBS = Gauge(
    "qm_waiting_jobs",
    "Jobs submitted and not yet placed (libs/readmodels/job_state.py's WAITING)",
    ["cluster", "allocation"],
)
GPUS = Gauge(
    "qm_gpus",
    "GPUs by state: busy (a task or workflow serving holds it), idle (a task holds it and "
    "its agent reports it idle), serving (workflow serving holds it, no task runs there), "
    "free, lost (on a node placement declared lost)",
    ["cluster", "state"],
)
GPUS_HELD_ON_LOST_NODES = Gauge(
    "qm_gpus_held_on_lost_nodes",
    "GPUs that tasks or workflow serving still hold on nodes placement declared lost "
    "(placement ends such tasks at once: anything that stays here has leaked)",
    ["cluster"],
)
ALLOCATION_ENTITLED_GPUS = Gauge(
    "qm_allocation_entitled_gpus",
    "An allocation's entitlement times the cluster's GPUs on live nodes",
    ["cluster", "allocation"],
)
ALLOCATION_DEMAND_GPUS = Gauge(
    "qm_allocation_demand_gpus",
    "GPUs an allocation's charged work holds and its charged waiting work asks for (a job "
    "larger than the cluster is no demand); owed now: min(entitled, demand)",
    ["cluster", "allocation"],
)
ALLOCATION_DELIVERED_GPU_HOURS = Gauge(
    "qm_allocation_delivered_gpu_hours",
    "GPU-hours charged to an allocation over the lookback window (the usage ledger's)",
    ["cluster", "allocation"],
)


def consumer_lag(
    ends: Mapping[TopicPartition, int], positions: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Records behind per partition; a position past a stale end offset is 0 behind."""
    return {tp: max(0, end - positions[tp]) for tp, end in ends.items() if tp in positions}
