"""The service edge: protobuf events to core inputs, core decisions to events.

Converting here, once, keeps protobuf out of the core. The placement service
and the audit replayer both use these functions, so they read the log alike.
"""

from __future__ import annotations

from qm.v1 import events_pb2, types_pb2

from libs.core import (
    Cancel,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    JobSpec,
    NodeJoined,
    NodeSpec,
    Place,
    Stop,
    StopCause,
    TaskEnded,
    Tick,
    Wait,
)
from libs.events.envelope import DEFAULT_CLUSTER, event_type, occurred_at

_STOP_CAUSES = {
    StopCause.CANCELLED: types_pb2.STOP_CAUSE_CANCELLED,
    StopCause.PREEMPTED: types_pb2.STOP_CAUSE_PREEMPTED,
}


def spec_from_proto(spec: types_pb2.JobSpec) -> JobSpec:
    return JobSpec(
        allocation=spec.allocation,
        user=spec.user,
        gpus=spec.gpus,
        command=tuple(spec.command),
        gpu_type=spec.gpu_type,
        min_runtime_s=spec.min_runtime_s,
        resumable=spec.resumable,
        priority=spec.priority,
        client_request_id=spec.client_request_id,
        cluster=spec.cluster or DEFAULT_CLUSTER,
        env=tuple(sorted(spec.env.items())),
        simulated_duration_s=spec.simulated_duration_s,
        simulated_exit_code=spec.simulated_exit_code,
    )


def spec_to_proto(spec: JobSpec) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(
        allocation=spec.allocation,
        user=spec.user,
        gpus=spec.gpus,
        command=list(spec.command),
        gpu_type=spec.gpu_type,
        min_runtime_s=spec.min_runtime_s,
        resumable=spec.resumable,
        priority=spec.priority,
        client_request_id=spec.client_request_id,
        cluster=spec.cluster,
        env=dict(spec.env),
        simulated_duration_s=spec.simulated_duration_s,
        simulated_exit_code=spec.simulated_exit_code,
    )


def node_from_proto(inventory: types_pb2.NodeInventory) -> NodeSpec:
    types = sorted({gpu.type for gpu in inventory.gpus})
    return NodeSpec(
        node_id=inventory.node_id,
        gpu_type="/".join(types),
        gpu_indices=tuple(sorted(gpu.index for gpu in inventory.gpus)),
    )


def to_input(env: events_pb2.Envelope) -> Input | None:
    """The core input an envelope stands for; None for events the scheduler ignores."""
    at = occurred_at(env)
    match event_type(env):
        case "job_admitted":
            p = env.job_admitted
            return JobArrived(at, p.job_id, spec_from_proto(p.spec))
        case "node_registered":
            return NodeJoined(at, node_from_proto(env.node_registered.inventory))
        case "task_finished":
            f = env.task_finished
            return TaskEnded(at, f.job_id, f.task_id, f.node_id)
        case "task_failed":
            g = env.task_failed
            return TaskEnded(at, g.job_id, g.task_id, g.node_id)
        case "job_cancel_requested":
            return CancelRequested(at, env.job_cancel_requested.job_id)
        case "clock_tick":
            return Tick(at)
    return None


def decision_payload(
    decision: Decision, provenance: types_pb2.Provenance
) -> (
    events_pb2.TaskPlaced
    | events_pb2.JobPending
    | events_pb2.TaskStopRequested
    | events_pb2.JobCancelled
):
    match decision:
        case Place():
            return events_pb2.TaskPlaced(
                job_id=decision.job_id,
                task_id=decision.task_id,
                node_id=decision.node_id,
                gpu_indices=list(decision.gpu_indices),
                spec=spec_to_proto(decision.spec),
                provenance=provenance,
            )
        case Wait():
            return events_pb2.JobPending(
                job_id=decision.job_id, reason=decision.reason, provenance=provenance
            )
        case Stop():
            return events_pb2.TaskStopRequested(
                job_id=decision.job_id,
                task_id=decision.task_id,
                node_id=decision.node_id,
                reason=decision.reason,
                cause=_STOP_CAUSES[decision.cause],
                provenance=provenance,
            )
        case Cancel():
            return events_pb2.JobCancelled(
                job_id=decision.job_id, reason=decision.reason, provenance=provenance
            )
