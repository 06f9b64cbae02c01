"""The service edge: protobuf events to core inputs, core decisions to events.

Converting here, once, keeps protobuf out of the core. The placement service,
the audit replayer and the budget service all use these functions, so they
read the log alike.

A core dataclass and the message it travels as name their fields alike, so most
fields are copied by name (``_from_message``, ``_fields``); only the fields whose
types differ are converted by hand: durations and times (plain seconds or milliseconds in
the core, ``Duration`` and ``Timestamp`` on the wire; ``libs.events.wire_time``) and the simulation
entries of a job's environment (``libs.core.simulated``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.descriptor import Descriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    BudgetSet,
    Cancel,
    CancelRequested,
    Decision,
    Dependency,
    Input,
    JobArrived,
    JobHeld,
    JobLost,
    JobSpec,
    JobUpdated,
    ModelEvicted,
    ModelLoaded,
    NodeApproved,
    NodeCordoned,
    NodeHeartbeat,
    NodeJoined,
    NodeKind,
    NodeLost,
    NodeRevoked,
    NodeSpec,
    Place,
    Planned,
    PlannedTask,
    Preempted,
    Preemption,
    PreemptionRule,
    Protection,
    Refused,
    Reject,
    Requeue,
    ServingHeld,
    ServingReleased,
    ServingTask,
    Stop,
    StopCause,
    TaskCheckpointed,
    TaskEnded,
    TaskIdle,
    TaskLost,
    TaskRefused,
    TaskStarted,
    Tick,
    UsageSnapshot,
    Wait,
    validate_job,
)
from libs.core.budget_tree import BudgetNode, BudgetTree, InvalidTree
from libs.core.compass.workflow import (
    Task,
    Workflow,
    WorkflowError,
    build_workflow,
)
from libs.core.ids import JobId, NodeId
from libs.core.limits import MAX_REASON_CHARS, MAX_SPEC_BYTES
from libs.core.model import node_gpu_memory_gib
from libs.core.simulated import SimulatedRun, split_env, to_env
from libs.events.envelope import DEFAULT_CLUSTER, event_type, occurred_at
from libs.events.wire_time import (
    duration,
    duration_ms,
    milliseconds,
    seconds,
    timestamp_ms,
    whole_seconds,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


D = TypeVar("D", bound="DataclassInstance")

_STOP_CAUSES = {
    StopCause.CANCELLED: types_pb2.STOP_CAUSE_CANCELLED,
    StopCause.PREEMPTED: types_pb2.STOP_CAUSE_PREEMPTED,
    StopCause.NODE_LOST: types_pb2.STOP_CAUSE_NODE_LOST,
    StopCause.DRAINED: types_pb2.STOP_CAUSE_DRAINED,
    StopCause.TIME_LIMIT: types_pb2.STOP_CAUSE_TIME_LIMIT,
    StopCause.GANG_FAILED: types_pb2.STOP_CAUSE_GANG_FAILED,
}

_PROTECTIONS = {
    Protection.FREE: types_pb2.PROTECTION_FREE,
    Protection.CONTRACT: types_pb2.PROTECTION_CONTRACT,
    Protection.BORROWED: types_pb2.PROTECTION_BORROWED,
}

_PREEMPTION_RULES = {
    PreemptionRule.FREE_WORK: types_pb2.PREEMPTION_RULE_FREE_WORK,
    PreemptionRule.BORROWED: types_pb2.PREEMPTION_RULE_BORROWED,
    PreemptionRule.CONTRACT_ENDED: types_pb2.PREEMPTION_RULE_CONTRACT_ENDED,
}

_RULES_FROM_WIRE = {wire: rule for rule, wire in _PREEMPTION_RULES.items()}
_CAUSES_FROM_WIRE = {wire: cause for cause, wire in _STOP_CAUSES.items()}

# The inputs whose every field but ``at`` is the event's field of the same name.
_PLAIN_INPUTS: dict[str, type[Input]] = {
    "node_heartbeat": NodeHeartbeat,
    "task_started": TaskStarted,
    "task_finished": TaskEnded,
    "task_failed": TaskEnded,
    "task_idle": TaskIdle,
    "task_checkpointed": TaskCheckpointed,
    "model_loaded": ModelLoaded,
    "model_evicted": ModelEvicted,
    "job_cancel_requested": CancelRequested,
    "job_held": JobHeld,
    "node_cordoned": NodeCordoned,
    "node_approved": NodeApproved,
    "node_revoked": NodeRevoked,
    "clock_tick": Tick,
}

# The event each decision is recorded as; its fields are the decision's.
_EVENTS: dict[type[Decision], Callable[..., Message]] = {
    Place: events_pb2.TaskPlaced,
    Planned: events_pb2.WorkflowPlanned,
    Wait: events_pb2.JobPending,
    Stop: events_pb2.TaskStopRequested,
    Cancel: events_pb2.JobCancelled,
    Requeue: events_pb2.JobRequeued,
    Preempted: events_pb2.JobPreempted,
    Reject: events_pb2.JobRejected,
    Refused: events_pb2.InputRefused,
    NodeLost: events_pb2.NodeLost,
    TaskLost: events_pb2.TaskLost,
    JobLost: events_pb2.JobLost,
    ServingHeld: events_pb2.ServingHeld,
    ServingReleased: events_pb2.ServingReleased,
}


def _from_message(cls: type[D], message: Message, **given: Any) -> D:
    """``cls`` with each field taken from the message's field of that name, a
    repeated one as a tuple; ``given``: the fields that need converting."""
    plain = {
        n: tuple(getattr(message, n)) if repeated else getattr(message, n)
        for n, repeated in _shared_fields(cls, message.DESCRIPTOR)
        if n not in given
    }
    return cls(**plain, **given)


@cache
def _shared_fields(cls: type, message: Descriptor) -> tuple[tuple[str, bool], ...]:
    """Each of ``cls``'s fields, and whether the message's field of that name is
    repeated: worked out once per pair, as every input of the log is converted."""
    by_name = message.fields_by_name
    return tuple((f.name, f.name in by_name and by_name[f.name].is_repeated) for f in fields(cls))


def _fields(source: DataclassInstance, *but: str) -> dict[str, Any]:
    """A dataclass's fields by name, to construct the message of the same fields
    from; ``but``: those left out, to be converted by hand."""
    return {n: getattr(source, n) for n in _field_names(type(source)) if n not in but}


@cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


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
    run, env = split_env(spec.env)
    if spec.HasField("workflow"):
        if workflow_as_given:
            workflow = Workflow(spec.workflow.name, workflow_tasks_from_proto(spec.workflow))
        else:
            workflow = workflow_from_proto(spec.workflow)
    return _from_message(
        JobSpec,
        spec,
        cluster=spec.cluster or DEFAULT_CLUSTER,
        env=tuple(sorted(env.items())),
        simulated_duration_s=run.duration_s,
        simulated_exit_code=run.exit_code,
        simulated_utilization=run.utilization,
        min_runtime_s=whole_seconds(spec.min_runtime),
        runtime_estimate_s=seconds(spec.runtime_estimate),
        time_limit_s=whole_seconds(spec.time_limit),
        warning_signal=spec.stop_warning.signal,
        warning_s=whole_seconds(spec.stop_warning.before),
        mounts=tuple((m.volume, m.path) for m in spec.mounts),
        array=(spec.array.index, spec.array.count) if spec.HasField("array") else None,
        after=tuple(
            Dependency(d.job_id, d.condition == types_pb2.DEPENDENCY_CONDITION_ANY)
            for d in spec.after
        ),
        workflow=workflow,
    )


def workflow_tasks_from_proto(workflow: types_pb2.Workflow) -> tuple[Task, ...]:
    """The tasks as written, unchecked."""
    return tuple(
        _from_message(Task, t, run_ms=milliseconds(t.run_duration)) for t in workflow.tasks
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
    tasks = [
        types_pb2.WorkflowTask(**_fields(t, "run_ms"), run_duration=_duration_ms(t.run_ms))
        for t in workflow.tasks
    ]
    return types_pb2.Workflow(name=workflow.name, tasks=tasks)


# The core's fields that travel differently in the JobSpec message.
_SPEC_BY_HAND = (
    "env",
    "workflow",
    "simulated_duration_s",
    "simulated_exit_code",
    "simulated_utilization",
    "min_runtime_s",
    "runtime_estimate_s",
    "time_limit_s",
    "after",
    "warning_signal",
    "warning_s",
    "mounts",
    "array",
)


def spec_to_proto(spec: JobSpec) -> types_pb2.JobSpec:
    run = SimulatedRun(
        spec.simulated_duration_s, spec.simulated_exit_code, spec.simulated_utilization
    )
    return types_pb2.JobSpec(
        **_fields(spec, *_SPEC_BY_HAND),
        env=dict(spec.env) | to_env(run),
        min_runtime=duration(spec.min_runtime_s) if spec.min_runtime_s else None,
        runtime_estimate=duration(spec.runtime_estimate_s) if spec.runtime_estimate_s else None,
        time_limit=duration(spec.time_limit_s) if spec.time_limit_s else None,
        stop_warning=types_pb2.StopWarning(
            signal=spec.warning_signal, before=duration(spec.warning_s)
        )
        if spec.warning_signal or spec.warning_s
        else None,
        mounts=[types_pb2.Mount(volume=volume, path=path) for volume, path in spec.mounts],
        array=types_pb2.ArrayElement(index=spec.array[0], count=spec.array[1])
        if spec.array is not None
        else None,
        after=[
            types_pb2.Dependency(
                job_id=d.job_id,
                condition=types_pb2.DEPENDENCY_CONDITION_ANY
                if d.any_end
                else types_pb2.DEPENDENCY_CONDITION_OK,
            )
            for d in spec.after
        ],
        workflow=workflow_to_proto(spec.workflow) if spec.workflow is not None else None,
    )


def node_from_proto(inventory: types_pb2.NodeInventory) -> NodeSpec:
    types = sorted({gpu.type for gpu in inventory.gpus})
    return NodeSpec(
        node_id=NodeId(inventory.node_id),
        gpu_type="/".join(types),
        gpu_indices=tuple(sorted(gpu.index for gpu in inventory.gpus)),
        gpu_memory_gib=node_gpu_memory_gib(gpu.memory_bytes for gpu in inventory.gpus),
        kind=node_kind(inventory),
        address=inventory.address,
    )


def node_kind(inventory: types_pb2.NodeInventory) -> NodeKind:
    """What the node runs: workflows only, nothing (simulated) or processes (an executor
    not reported is a process node, as the API says)."""
    if inventory.workflows_only:
        return NodeKind.SERVING
    if inventory.executor == types_pb2.EXECUTOR_SIMULATED:
        return NodeKind.SIMULATED
    return NodeKind.PROCESS


def budget_node_from_proto(node: types_pb2.BudgetNode) -> BudgetNode:
    return _from_message(BudgetNode, node)


def tree_from_proto(tree: types_pb2.BudgetTree) -> BudgetTree:
    return BudgetTree(tuple(budget_node_from_proto(n) for n in tree.nodes))


def tree_to_proto(tree: BudgetTree, version: int) -> types_pb2.BudgetTree:
    nodes = [types_pb2.BudgetNode(**_fields(n)) for n in tree.nodes]
    return types_pb2.BudgetTree(version=version, nodes=nodes)


def to_input(env: events_pb2.Envelope) -> Input | Reject | Refused | None:
    """The core input an envelope stands for; None for events the scheduler ignores.

    An envelope that cannot become an input is answered here instead, as the core
    answers an input it cannot act on: a job's with a ``Reject`` (its spec too large
    to copy into the records placement writes, or a workflow that is not a DAG), a
    budget tree's with a ``Refused``.
    """
    at = occurred_at(env)
    kind = event_type(env)
    plain = _PLAIN_INPUTS.get(kind)
    if plain is not None:
        return _from_message(plain, getattr(env, kind), at=at)
    match kind:
        case "job_admitted":
            return _arrived(at, env.job_admitted)
        case "node_registered":
            r = env.node_registered
            node = node_from_proto(r.inventory)
            heartbeat_s = seconds(r.heartbeat_interval)
            return _from_message(NodeJoined, r, at=at, node=node, heartbeat_s=heartbeat_s)
        case "job_updated":
            updated = env.job_updated
            spec = spec_from_proto(updated.spec)
            return _from_message(JobUpdated, updated, at=at, spec=spec)
        case "budget_changed":
            try:
                return BudgetSet(at, tree_from_proto(env.budget_changed.tree))
            except InvalidTree as exc:
                return Refused(f"budget tree version {env.budget_changed.tree.version}", str(exc))
        case "task_refused":
            refused = env.task_refused
            return _from_message(TaskRefused, refused, at=at, wait_ms=milliseconds(refused.wait))
        case "usage_snapshot":
            u = env.usage_snapshot
            usage = tuple(sorted((a.allocation, a.allocated_gpu_s) for a in u.usage))
            return UsageSnapshot(at, seconds(u.window), usage)
    return None


def _arrived(at: float, admitted: events_pb2.JobAdmitted) -> JobArrived | Reject:
    job_id = JobId(admitted.job_id)
    size = admitted.spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        return Reject(job_id, "spec", f"is {size} bytes; at most {MAX_SPEC_BYTES}")
    spec = spec_from_proto(admitted.spec)
    if admitted.spec.HasField("workflow") and spec.workflow is None:
        given = spec_from_proto(admitted.spec, workflow_as_given=True)
        broken = [v for v in validate_job(given) if v.field.startswith("workflow")]
        return Reject(job_id, broken[0].field, "; ".join(str(v) for v in broken))
    return JobArrived(at, job_id, spec)


def decision_payload(
    decision: Decision, provenance: types_pb2.Provenance, spec: types_pb2.JobSpec | None = None
) -> Message:
    """The event a decision is recorded as. ``spec``: the job's as it arrived, which a
    rejection repeats when it fits (a spec rejected for its size is left out)."""
    values = _fields(decision)
    if "reason" in values:
        values["reason"] = _cut(values["reason"])
    match decision:
        case Place():
            # A workflow task's placement leaves the workflow out: the task's part of it
            # is its ServingTask, the whole is in the job's submission, and a copy per
            # task would be the workflow's size times its tasks on the decisions topic.
            placed_spec = decision.spec
            serving = None
            if decision.serving is not None:
                placed_spec = replace(placed_spec, workflow=None)
                serving = serving_to_proto(decision.serving)
            protection, protected_s = values.pop("protection"), values.pop("protected_s")
            values["gang"] = [events_pb2.GangPart(**_fields(part)) for part in decision.gang]
            values.update(
                spec=spec_to_proto(placed_spec),
                serving=serving,
                protection=_PROTECTIONS[protection] if protection is not None else None,
                protected_for=duration(protected_s) if protected_s else None,
            )
        case Planned():
            values["tasks"] = [_planned_task(t) for t in decision.tasks]
        case Stop():
            values["cause"] = _STOP_CAUSES[decision.cause]
            grace_s, warn_s = values.pop("grace_s"), values.pop("warn_s")
            values["grace"] = duration(grace_s) if grace_s else None
            values["warn_for"] = duration(warn_s) if warn_s else None
            preemption = decision.preemption
            values["preemption"] = (
                None
                if preemption is None
                else types_pb2.Preemption(
                    job_id=preemption.job_id,
                    allocation=preemption.allocation,
                    rule=_PREEMPTION_RULES[preemption.rule],
                )
            )
        case Wait():
            # The edge renders the core's code into words; both are recorded.
            why = values.pop("why")
            values.update(
                reason=_cut(why.words()),
                code=why.code.value,
                fields=[events_pb2.ReasonField(name=n, value=_cut(v)) for n, v in why.fields],
            )
        case Reject() if spec is not None and spec.ByteSize() <= MAX_SPEC_BYTES:
            values["spec"] = spec
    return _EVENTS[type(decision)](**values, provenance=provenance)


def _duration_ms(ms: float) -> Duration | None:
    """Zero is left unset, as a plain number's zero was."""
    return duration_ms(ms) if ms else None


def _planned_task(task: PlannedTask) -> events_pb2.PlannedTask:
    return events_pb2.PlannedTask(
        **_fields(task, "start_ms", "finish_ms", "load_ms"),
        start_time=timestamp_ms(task.start_ms),
        finish_time=timestamp_ms(task.finish_ms),
        load_duration=_duration_ms(task.load_ms),
    )


def _cut(reason: str) -> str:
    """Reasons are for people and must not make a record too large."""
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"


def preemption_from_proto(preemption: types_pb2.Preemption) -> Preemption | None:
    """The core's preemption (its ``str`` says it for people); None for a rule this
    release does not know."""
    rule = _RULES_FROM_WIRE.get(preemption.rule)
    return None if rule is None else Preemption(preemption.job_id, preemption.allocation, rule)


def stop_cause_from_proto(cause: types_pb2.StopCause.ValueType) -> StopCause | None:
    """The core's stop cause; None when none is said, or for one this release does not know."""
    return _CAUSES_FROM_WIRE.get(cause)


def serving_to_proto(serving: ServingTask) -> events_pb2.ServingTask:
    """``planned`` None (the task runs where it was planned) leaves planned_node_id empty."""
    node_id, gpu_index = serving.planned if serving.planned is not None else ("", 0)
    limit = serving.wait_limit_ms
    return events_pb2.ServingTask(
        **_fields(serving, "planned", "run_ms", "input_delay_ms", "wait_limit_ms"),
        run_duration=_duration_ms(serving.run_ms),
        input_delay=_duration_ms(serving.input_delay_ms),
        planned_node_id=node_id,
        planned_gpu_index=gpu_index,
        wait_limit=None if limit is None else duration_ms(limit),
    )


def serving_from_proto(serving: events_pb2.ServingTask) -> ServingTask:
    planned = (serving.planned_node_id, serving.planned_gpu_index)
    limit = milliseconds(serving.wait_limit) if serving.HasField("wait_limit") else None
    return _from_message(
        ServingTask,
        serving,
        run_ms=milliseconds(serving.run_duration),
        input_delay_ms=milliseconds(serving.input_delay),
        planned=planned if serving.planned_node_id else None,
        wait_limit_ms=limit,
    )
