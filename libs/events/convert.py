"""The service edge: protobuf events to core inputs, core decisions to events.

Converting here, once, keeps protobuf out of the core. The placement service,
the audit replayer and the budget service all use these functions, so they
read the log alike.
"""

from __future__ import annotations

import math
from dataclasses import replace

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    BudgetSet,
    Cancel,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    JobLost,
    JobSpec,
    ModelEvicted,
    ModelLoaded,
    NodeHeartbeat,
    NodeJoined,
    NodeLost,
    NodeSpec,
    Place,
    Planned,
    Preempted,
    Refused,
    Reject,
    Requeue,
    ServingTask,
    Stop,
    StopCause,
    TaskEnded,
    TaskIdle,
    TaskLost,
    TaskStarted,
    Tick,
    UsageSnapshot,
    Wait,
    validate_job,
)
from libs.core.budget_tree import BudgetNode, BudgetTree, InvalidTree
from libs.core.compass.workflow import (
    BYTES_PER_MB,
    Task,
    Workflow,
    WorkflowError,
    build_workflow,
)
from libs.core.ids import JobId, NodeId, TaskId
from libs.core.limits import MAX_REASON_CHARS, MAX_SPEC_BYTES
from libs.events.envelope import DEFAULT_CLUSTER, event_type, occurred_at

GIB = 1 << 30

_STOP_CAUSES = {
    StopCause.CANCELLED: types_pb2.STOP_CAUSE_CANCELLED,
    StopCause.PREEMPTED: types_pb2.STOP_CAUSE_PREEMPTED,
    StopCause.NODE_LOST: types_pb2.STOP_CAUSE_NODE_LOST,
}


def spec_from_proto(spec: types_pb2.JobSpec, *, workflow_as_given: bool = False) -> JobSpec:
    """The core's job spec; a workflow is checked and put in topological order.

    A workflow that breaks a DAG rule is dropped (``workflow=None``): a ``Workflow``
    whose tasks are not a DAG in topological order would break the planner. Admission
    refuses such workflows, and placement rejects one that reaches the log around it
    (``to_input``), so no scheduler ever reads that plain job. GPU memory is not
    checked here (the largest GPU is admission's knowledge, not the log's): a model
    too large for every GPU waits for one.

    ``workflow_as_given``: keep the workflow's tasks unchecked, in the order
    given, for ``validate_job`` to judge; such a spec is never for the scheduler.
    """
    workflow: Workflow | None = None
    if spec.HasField("workflow"):
        if workflow_as_given:
            workflow = Workflow(spec.workflow.name, workflow_tasks_from_proto(spec.workflow))
        else:
            workflow = workflow_from_proto(spec.workflow)
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
        workflow=workflow,
    )


def workflow_tasks_from_proto(workflow: types_pb2.Workflow) -> tuple[Task, ...]:
    """The tasks as written, unchecked."""
    return tuple(
        Task(
            task_id=t.task_id,
            model=t.model,
            model_mb=t.model_mb,
            run_ms=t.run_ms,
            in_kb=t.in_kb,
            out_kb=t.out_kb,
            parents=tuple(t.parents),
        )
        for t in workflow.tasks
    )


def workflow_from_proto(workflow: types_pb2.Workflow) -> Workflow | None:
    """The checked workflow in topological order; None when it breaks a DAG rule.

    Memory is not checked (any model fits): see ``spec_from_proto``.
    """
    try:
        return build_workflow(workflow.name, workflow_tasks_from_proto(workflow), math.inf)
    except WorkflowError:
        return None


def workflow_to_proto(workflow: Workflow) -> types_pb2.Workflow:
    return types_pb2.Workflow(
        name=workflow.name,
        tasks=[
            types_pb2.WorkflowTask(
                task_id=t.task_id,
                model=t.model,
                model_mb=t.model_mb,
                run_ms=t.run_ms,
                in_kb=t.in_kb,
                out_kb=t.out_kb,
                parents=list(t.parents),
            )
            for t in workflow.tasks
        ],
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
        workflow=workflow_to_proto(spec.workflow) if spec.workflow is not None else None,
    )


def gpu_memory_mb(inventory: types_pb2.NodeInventory, gpu_type: str = "") -> float:
    """A node's largest GPU in MB (10^6 bytes, as model sizes); 0 when it has none.

    ``gpu_type``: only GPUs of that type (empty: any).
    """
    sizes = (g.memory_bytes for g in inventory.gpus if not gpu_type or g.type == gpu_type)
    return max(sizes, default=0) / BYTES_PER_MB


def node_from_proto(inventory: types_pb2.NodeInventory) -> NodeSpec:
    types = sorted({gpu.type for gpu in inventory.gpus})
    memory = min((gpu.memory_bytes for gpu in inventory.gpus), default=0)
    return NodeSpec(
        node_id=NodeId(inventory.node_id),
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


def to_input(env: events_pb2.Envelope) -> Input | Reject | Refused | None:
    """The core input an envelope stands for; None for events the scheduler ignores.

    An envelope that cannot become an input is answered here instead, as the core
    answers an input it cannot act on: a job's with a ``Reject`` (its spec too large
    to copy into the records placement writes, or a workflow that is not a DAG), a
    budget tree's with a ``Refused``.
    """
    at = occurred_at(env)
    match event_type(env):
        case "job_admitted":
            return _arrived(at, env.job_admitted)
        case "node_registered":
            r = env.node_registered
            return NodeJoined(at, node_from_proto(r.inventory), r.incarnation, r.heartbeat_s)
        case "node_heartbeat":
            h = env.node_heartbeat
            return NodeHeartbeat(at, NodeId(h.node_id), h.incarnation)
        case "task_started":
            s = env.task_started
            return TaskStarted(at, JobId(s.job_id), TaskId(s.task_id), NodeId(s.node_id))
        case "task_finished":
            f = env.task_finished
            return TaskEnded(at, JobId(f.job_id), TaskId(f.task_id), NodeId(f.node_id), f.exit_code)
        case "task_failed":
            g = env.task_failed
            return TaskEnded(at, JobId(g.job_id), TaskId(g.task_id), NodeId(g.node_id), g.exit_code)
        case "task_idle":
            i = env.task_idle
            return TaskIdle(at, JobId(i.job_id), TaskId(i.task_id), i.idle)
        case "model_loaded":
            m = env.model_loaded
            return ModelLoaded(at, NodeId(m.node_id), m.gpu_index, m.model, m.size_mb)
        case "model_evicted":
            e = env.model_evicted
            return ModelEvicted(at, NodeId(e.node_id), e.gpu_index, e.model)
        case "job_cancel_requested":
            return CancelRequested(at, JobId(env.job_cancel_requested.job_id))
        case "budget_changed":
            try:
                return BudgetSet(at, tree_from_proto(env.budget_changed.tree))
            except InvalidTree as exc:
                return Refused(f"budget tree version {env.budget_changed.tree.version}", str(exc))
        case "usage_snapshot":
            u = env.usage_snapshot
            usage = tuple(sorted((a.allocation, a.allocated_gpu_s) for a in u.usage))
            return UsageSnapshot(at, u.window_s, usage)
        case "clock_tick":
            return Tick(at)
    return None


def _arrived(at: float, admitted: events_pb2.JobAdmitted) -> JobArrived | Reject:
    size = admitted.spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        return Reject(admitted.job_id, "spec", f"is {size} bytes; at most {MAX_SPEC_BYTES}")
    spec = spec_from_proto(admitted.spec)
    if admitted.spec.HasField("workflow") and spec.workflow is None:
        given = spec_from_proto(admitted.spec, workflow_as_given=True)
        broken = [v for v in validate_job(given) if v.field.startswith("workflow")]
        return Reject(admitted.job_id, broken[0].field, "; ".join(str(v) for v in broken))
    return JobArrived(at, JobId(admitted.job_id), spec)


def decision_payload(
    decision: Decision, provenance: types_pb2.Provenance, spec: types_pb2.JobSpec | None = None
) -> Message:
    """The event a decision is recorded as. ``spec``: the job's as it arrived, which a
    rejection repeats when it fits (a spec rejected for its size is left out)."""
    match decision:
        case Place():
            # A workflow task's placement leaves the workflow out: the task's part of it
            # is its ServingTask, the whole is in the job's submission, and a copy per
            # task would be the workflow's size times its tasks on the decisions topic.
            placed_spec = decision.spec
            if decision.serving is not None:
                placed_spec = replace(placed_spec, workflow=None)
            placed = events_pb2.TaskPlaced(
                job_id=decision.job_id,
                task_id=decision.task_id,
                node_id=decision.node_id,
                gpu_indices=list(decision.gpu_indices),
                spec=spec_to_proto(placed_spec),
                provenance=provenance,
                node_incarnation=decision.node_incarnation,
            )
            if decision.serving is not None:
                placed.serving.CopyFrom(serving_to_proto(decision.serving))
            return placed
        case Planned():
            return events_pb2.WorkflowPlanned(
                job_id=decision.job_id,
                mode=decision.mode,
                tasks=[
                    events_pb2.PlannedTask(
                        name=t.name,
                        node_id=t.node_id,
                        gpu_index=t.gpu_index,
                        start_ms=t.start_ms,
                        finish_ms=t.finish_ms,
                        load_ms=t.load_ms,
                    )
                    for t in decision.tasks
                ],
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
        case Reject():
            rejected = events_pb2.JobRejected(
                job_id=decision.job_id,
                field=decision.field,
                reason=_cut(decision.reason),
                provenance=provenance,
            )
            if spec is not None and spec.ByteSize() <= MAX_SPEC_BYTES:
                rejected.spec.CopyFrom(spec)
            return rejected
        case Refused():
            return events_pb2.InputRefused(
                subject=decision.subject, reason=_cut(decision.reason), provenance=provenance
            )
        case NodeLost():
            return events_pb2.NodeLost(
                node_id=decision.node_id,
                incarnation=decision.incarnation,
                reason=_cut(decision.reason),
                provenance=provenance,
            )
        case TaskLost():
            return events_pb2.TaskLost(
                job_id=decision.job_id,
                task_id=decision.task_id,
                node_id=decision.node_id,
                reason=_cut(decision.reason),
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
        case JobLost():
            message = events_pb2.JobLost
    return message(job_id=decision.job_id, reason=_cut(decision.reason), provenance=provenance)


def _cut(reason: str) -> str:
    """Reasons are for people and must not make a record too large."""
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"


def serving_to_proto(serving: ServingTask) -> events_pb2.ServingTask:
    """``planned`` None (the task runs where it was planned) leaves planned_node_id empty."""
    node_id, gpu_index = serving.planned if serving.planned is not None else ("", 0)
    return events_pb2.ServingTask(
        name=serving.name,
        model=serving.model,
        model_mb=serving.model_mb,
        run_ms=serving.run_ms,
        input_delay_ms=serving.input_delay_ms,
        upcoming=list(serving.upcoming),
        planned_node_id=node_id,
        planned_gpu_index=gpu_index,
        reason=serving.reason,
    )


def serving_from_proto(serving: events_pb2.ServingTask) -> ServingTask:
    planned = (serving.planned_node_id, serving.planned_gpu_index)
    return ServingTask(
        name=serving.name,
        model=serving.model,
        model_mb=serving.model_mb,
        run_ms=serving.run_ms,
        input_delay_ms=serving.input_delay_ms,
        upcoming=tuple(serving.upcoming),
        planned=planned if serving.planned_node_id else None,
        reason=serving.reason,
    )
