"""The agent's decisions as pure functions: which records concern it, what to report."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import TypedDict

from qm.v1 import events_pb2

from libs.core.compass import Eviction, Start
from libs.events import event_type
from libs.events.wire_time import duration_ms
from services.node_agent.launch import LaunchError

Decision = events_pb2.TaskPlaced | events_pb2.TaskStopRequested | events_pb2.NodeLost
Outcome = events_pb2.TaskFinished | events_pb2.TaskFailed


class _TaskRef(TypedDict):
    """The fields that name a task in every report about it."""

    job_id: str
    task_id: str
    node_id: str


def _ref(task: events_pb2.TaskPlaced) -> _TaskRef:
    return _TaskRef(job_id=task.job_id, task_id=task.task_id, node_id=task.node_id)


def decision_for(env: events_pb2.Envelope, incarnations: Mapping[str, str]) -> Decision | None:
    """The placement decision in ``env`` if it is for one of the agent's nodes as they are
    now (``incarnations``: node id -> its incarnation).

    A placement made for an earlier incarnation is not: placement has already counted
    its task as lost. Neither is a node's loss declared for an earlier incarnation.
    """
    kind = event_type(env)
    decision: Decision
    if kind == "task_placed":
        decision = env.task_placed
        incarnation = decision.node_incarnation
    elif kind == "task_stop_requested":
        decision = env.task_stop_requested
        incarnation = ""
    elif kind == "node_lost":
        decision = env.node_lost
        incarnation = decision.incarnation
    else:
        return None
    current = incarnations.get(decision.node_id)
    if current is None or (incarnation and incarnation != current):
        return None
    return decision


def producer_name(node_id: str) -> str:
    return f"node-agent/{node_id}"


def started(task: events_pb2.TaskPlaced, pid: int) -> events_pb2.TaskStarted:
    return events_pb2.TaskStarted(**_ref(task), pid=pid)


def checkpointed(task: events_pb2.TaskPlaced) -> events_pb2.TaskCheckpointed:
    return events_pb2.TaskCheckpointed(**_ref(task))


def launch_failed(task: events_pb2.TaskPlaced, error: LaunchError) -> events_pb2.TaskFailed:
    return _failed(task, error.exit_code, error.reason)


def model_evicted(node_id: str, gpu_index: int, eviction: Eviction) -> events_pb2.ModelEvicted:
    return events_pb2.ModelEvicted(
        node_id=node_id, gpu_index=gpu_index, model=eviction.model, reason=eviction.reason
    )


def model_loaded(
    task: events_pb2.TaskPlaced, gpu_index: int, begun: Start
) -> events_pb2.ModelLoaded:
    return events_pb2.ModelLoaded(
        node_id=task.node_id,
        gpu_index=gpu_index,
        model=begun.serving.model,
        size_mb=begun.serving.model_mb,
        load_duration=duration_ms(begun.load_ms),
        job_id=task.job_id,
        task_id=task.task_id,
    )


def refused(task: events_pb2.TaskPlaced, gpu_index: int, wait_ms: float) -> events_pb2.TaskRefused:
    return events_pb2.TaskRefused(**_ref(task), gpu_index=gpu_index, wait=duration_ms(wait_ms))


def idle_changed(
    task: events_pb2.TaskPlaced, idle: bool, utilization: float
) -> events_pb2.TaskIdle:
    return events_pb2.TaskIdle(**_ref(task), idle=idle, utilization=utilization)


def stop_reason(request: events_pb2.TaskStopRequested) -> str:
    return f"stop requested: {request.reason}" if request.reason else "stop requested"


def ended(task: events_pb2.TaskPlaced, exit_code: int, stopped_because: str = "") -> Outcome:
    """How a task that ran came to an end.

    A stopped task failed even if it exited 0 on SIGTERM: it did not complete its work,
    and a preempted resumable job must be requeued, not counted as done.
    """
    if stopped_because:
        return _failed(task, exit_code, stopped_because)
    if exit_code == 0:
        return events_pb2.TaskFinished(**_ref(task), exit_code=0)
    return _failed(task, exit_code, exit_reason(exit_code))


def stopped_before_start(task: events_pb2.TaskPlaced, reason: str) -> events_pb2.TaskFailed:
    """A serving task stopped while queued or loading its model: failed as if by SIGTERM,
    the exit code a stopped running task reads under either executor."""
    return _failed(task, -signal.SIGTERM.value, reason)


def exit_reason(exit_code: int) -> str:
    if exit_code >= 0:
        return f"exited with code {exit_code}"
    try:
        return f"killed by {signal.Signals(-exit_code).name}"
    except ValueError:
        return f"killed by signal {-exit_code}"


def _failed(task: events_pb2.TaskPlaced, exit_code: int, reason: str) -> events_pb2.TaskFailed:
    return events_pb2.TaskFailed(**_ref(task), exit_code=exit_code, reason=reason)
