"""The service edge: protobuf events to core inputs, core decisions to events.

Converting here, once, keeps protobuf out of the core. The placement service,
the audit replayer and the budget service all use these functions, so they
read the log alike.
"""

from __future__ import annotations

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    BudgetSet,
    Cancel,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    JobSpec,
    NodeJoined,
    NodeSpec,
    Place,
    Preempted,
    Requeue,
    Stop,
    StopCause,
    TaskEnded,
    TaskIdle,
    TaskStarted,
    Tick,
    UsageSnapshot,
    Wait,
)
from libs.core.budget_tree import BudgetNode, BudgetTree
from libs.events.envelope import DEFAULT_CLUSTER, event_type, occurred_at

GIB = 1 << 30

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
        min_gpu_memory_gib=spec.min_gpu_memory_gib,
        simulated_utilization=spec.simulated_utilization,
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
        min_gpu_memory_gib=spec.min_gpu_memory_gib,
        simulated_utilization=spec.simulated_utilization,
    )


def node_from_proto(inventory: types_pb2.NodeInventory) -> NodeSpec:
    types = sorted({gpu.type for gpu in inventory.gpus})
    memory = min((gpu.memory_bytes for gpu in inventory.gpus), default=0)
    return NodeSpec(
        node_id=inventory.node_id,
        gpu_type="/".join(types),
        gpu_indices=tuple(sorted(gpu.index for gpu in inventory.gpus)),
        gpu_memory_gib=memory / GIB,
    )


def budget_node_from_proto(node: types_pb2.BudgetNode) -> BudgetNode:
    return BudgetNode(
        name=node.name,
        parent=node.parent,
        weight=node.weight,
        members=tuple(node.members),
        managers=tuple(node.managers),
    )


def tree_from_proto(tree: types_pb2.BudgetTree) -> BudgetTree:
    return BudgetTree(tuple(budget_node_from_proto(n) for n in tree.nodes))


def tree_to_proto(tree: BudgetTree, version: int) -> types_pb2.BudgetTree:
    return types_pb2.BudgetTree(
        version=version,
        nodes=[
            types_pb2.BudgetNode(
                name=n.name,
                parent=n.parent,
                weight=n.weight,
                members=list(n.members),
                managers=list(n.managers),
            )
            for n in tree.nodes
        ],
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
        case "task_started":
            s = env.task_started
            return TaskStarted(at, s.job_id, s.task_id, s.node_id)
        case "task_finished":
            f = env.task_finished
            return TaskEnded(at, f.job_id, f.task_id, f.node_id, f.exit_code)
        case "task_failed":
            g = env.task_failed
            return TaskEnded(at, g.job_id, g.task_id, g.node_id, g.exit_code)
        case "task_idle":
            i = env.task_idle
            return TaskIdle(at, i.job_id, i.task_id, i.idle)
        case "job_cancel_requested":
            return CancelRequested(at, env.job_cancel_requested.job_id)
        case "budget_changed":
            return BudgetSet(at, tree_from_proto(env.budget_changed.tree))
        case "usage_snapshot":
            u = env.usage_snapshot
            usage = tuple(sorted((a.allocation, a.allocated_gpu_s) for a in u.usage))
            return UsageSnapshot(at, u.window_s, usage)
        case "clock_tick":
            return Tick(at)
    return None


def decision_payload(decision: Decision, provenance: types_pb2.Provenance) -> Message:
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
        case Stop():
            return events_pb2.TaskStopRequested(
                job_id=decision.job_id,
                task_id=decision.task_id,
                node_id=decision.node_id,
                reason=decision.reason,
                cause=_STOP_CAUSES[decision.cause],
                provenance=provenance,
            )
        case Wait():
            message: type[Message] = events_pb2.JobPending
        case Cancel():
            message = events_pb2.JobCancelled
        case Requeue():
            message = events_pb2.JobRequeued
        case Preempted():
            message = events_pb2.JobPreempted
    return message(job_id=decision.job_id, reason=decision.reason, provenance=provenance)
