"""Quartermaster's Prometheus metrics: every instrument, named once, and the pure
functions that turn what a service already holds into their values.

Services update these from state they have (a poll's positions, a batch's decisions,
the projector's views); ``services.metrics_http`` serves them. Names follow
Prometheus' conventions: a ``qm_`` prefix, base units in the name, ``_total`` on counters.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from aiokafka.structs import TopicPartition
from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from qm.v1 import types_pb2

from libs.readmodels.job_state import ended_tasks

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
    "qm_waiting_jobs", "Admitted jobs waiting to be placed", ["cluster", "allocation"]
)
GPUS = Gauge(
    "qm_gpus",
    "GPUs by state: busy (a task holds it), idle (a task holds it and its agent reports it "
    "idle), free, lost (on a node placement declared lost)",
    ["cluster", "state"],
)
GPUS_HELD_ON_LOST_NODES = Gauge(
    "qm_gpus_held_on_lost_nodes",
    "GPUs that tasks still hold on nodes placement declared lost (placement ends such "
    "tasks at once: anything that stays here has leaked)",
    ["cluster"],
)
ALLOCATION_ENTITLED_GPUS = Gauge(
    "qm_allocation_entitled_gpus",
    "An allocation's entitlement times the cluster's GPUs on live nodes",
    ["cluster", "allocation"],
)
ALLOCATION_DEMAND_GPUS = Gauge(
    "qm_allocation_demand_gpus",
    "GPUs an allocation's jobs hold or wait for (owed now: min(entitled, demand))",
    ["cluster", "allocation"],
)
ALLOCATION_DELIVERED_GPU_HOURS = Gauge(
    "qm_allocation_delivered_gpu_hours",
    "GPU-hours charged to an allocation over the lookback window (the usage ledger's)",
    ["cluster", "allocation"],
)

_WAITING = frozenset({types_pb2.JOB_STATE_PENDING})


@dataclass(frozen=True)
class GpuCount:
    busy: int = 0
    idle: int = 0
    serving: int = 0  # held by workflow serving, no task running: its warm GPUs
    free: int = 0
    lost: int = 0
    held_on_lost: int = 0


def consumer_lag(
    ends: Mapping[TopicPartition, int], positions: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Records behind per partition; a position past a stale end offset is 0 behind."""
    return {tp: max(0, end - positions[tp]) for tp, end in ends.items() if tp in positions}


def gpu_states(
    nodes: Iterable[types_pb2.Node], job_of: Callable[[str], types_pb2.Job | None]
) -> dict[str, GpuCount]:
    """GPUs by state per cluster, from the node view; ``job_of`` looks up a task's job.

    A task whose job says it is over holds nothing (see ``libs.readmodels.nodes``);
    one of an unknown job still holds its GPUs, as the node view keeps it."""
    tallies: dict[str, Tally[str]] = {}
    for node in nodes:
        tally = tallies.setdefault(node.inventory.cluster, Tally())
        total = len(node.inventory.gpus)
        held = idle = 0
        running: set[int] = set()
        for task in node.running:
            job = job_of(task.job_id)
            if job is not None and ended_tasks(job)(task.task_id):
                continue
            held += len(task.gpu_indices)
            running.update(task.gpu_indices)
            if job is not None and job.idle:
                idle += len(task.gpu_indices)
        serving = sum(1 for gpu in node.serving if gpu.gpu_index not in running)
        if node.lost:
            tally["lost"] += total
            tally["held_on_lost"] += held
        else:
            tally["busy"] += held - idle
            tally["idle"] += idle
            tally["serving"] += serving
            tally["free"] += max(0, total - held - serving)
    return {cluster: GpuCount(**tally) for cluster, tally in tallies.items()}


@dataclass(frozen=True)
class AllocationLoad:
    waiting_jobs: int = 0
    demand_gpus: int = 0


def allocation_loads(jobs: Iterable[types_pb2.Job]) -> dict[tuple[str, str], AllocationLoad]:
    """Per (cluster, allocation): jobs waiting to be placed, and the GPUs its waiting and
    placed jobs want."""
    waiting: Tally[tuple[str, str]] = Tally()
    demand: Tally[tuple[str, str]] = Tally()
    for job in jobs:
        key = (job.spec.cluster or "default", job.spec.allocation)
        if job.state in _WAITING:
            waiting[key] += 1
            demand[key] += job.spec.gpus
        elif job.state in (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING):
            demand[key] += job.spec.gpus
    return {key: AllocationLoad(waiting[key], demand[key]) for key in waiting.keys() | demand}


def live_gpus(states: Mapping[str, GpuCount]) -> dict[str, int]:
    """GPUs on nodes not lost, per cluster: what entitlements are shares of."""
    return {cluster: c.busy + c.idle + c.serving + c.free for cluster, c in states.items()}
