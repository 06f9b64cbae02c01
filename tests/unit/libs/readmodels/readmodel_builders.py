"""Envelope builders for read-model tests: one function per event, times in seconds."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.events import new_envelope

T0 = 1_760_000_000.0


def spec(allocation: str = "team-a", gpus: int = 1, min_runtime_s: int = 0) -> types_pb2.JobSpec:
    """A job's spec; charged work (an allocation's, not free) with ``min_runtime_s``."""
    made = types_pb2.JobSpec(allocation=allocation, user="ada", gpus=gpus, command=["train"])
    if min_runtime_s:
        made.min_runtime.seconds = min_runtime_s
    return made


def env(payload: Message, at: float = T0, cluster: str = "default") -> events_pb2.Envelope:
    return new_envelope(
        payload,
        producer="test",
        cluster=cluster,
        occurred=datetime.fromtimestamp(at, UTC),
        event_id=f"{payload.DESCRIPTOR.name}@{at}",
    )


def submitted(job: str, at: float = T0, s: types_pb2.JobSpec | None = None) -> events_pb2.Envelope:
    return env(events_pb2.JobSubmitted(job_id=job, spec=s or spec()), at)


def admitted(
    job: str, at: float = T0, s: types_pb2.JobSpec | None = None, cluster: str = "default"
) -> events_pb2.Envelope:
    return env(events_pb2.JobAdmitted(job_id=job, spec=s or spec()), at, cluster)


def rejected(job: str, field: str, reason: str, at: float = T0) -> events_pb2.Envelope:
    return env(events_pb2.JobRejected(job_id=job, spec=spec(), field=field, reason=reason), at)


def pending(job: str, reason: str, at: float = T0, code: str = "") -> events_pb2.Envelope:
    return env(events_pb2.JobPending(job_id=job, reason=reason, code=code), at)


def placed(
    job: str, node: str = "n1", gpus: Iterable[int] = (0,), **where: Any
) -> events_pb2.Envelope:
    where.setdefault("spec", spec())
    return _task_event(events_pb2.TaskPlaced, job, node, gpu_indices=gpus, **where)


def started(job: str, node: str = "n1", **where: Any) -> events_pb2.Envelope:
    return _task_event(events_pb2.TaskStarted, job, node, pid=42, **where)


def finished(job: str, *, exit_code: int = 0, **where: Any) -> events_pb2.Envelope:
    return _task_event(events_pb2.TaskFinished, job, exit_code=exit_code, **where)


def failed(
    job: str, reason: str = "oom", *, exit_code: int = 1, **where: Any
) -> events_pb2.Envelope:
    return _task_event(events_pb2.TaskFailed, job, exit_code=exit_code, reason=reason, **where)


def stop(
    job: str,
    reason: str,
    node: str = "n1",
    *,
    cause: types_pb2.StopCause.ValueType = types_pb2.STOP_CAUSE_PREEMPTED,
    **where: Any,
) -> events_pb2.Envelope:
    return _task_event(events_pb2.TaskStopRequested, job, node, reason=reason, cause=cause, **where)


def idle(job: str, is_idle: bool = True, node: str = "n1", **where: Any) -> events_pb2.Envelope:
    return _task_event(events_pb2.TaskIdle, job, node, idle=is_idle, utilization=0.01, **where)


def _task_event(
    message: Callable[..., Message],
    job: str,
    node: str = "n1",
    *,
    at: float = T0,
    task: str | None = None,
    cluster: str = "default",
    **fields: Any,
) -> events_pb2.Envelope:
    """One task's event (``where`` above: its ``at``, ``task`` and ``cluster``); the task
    is the job's first unless named."""
    payload = message(job_id=job, task_id=task or f"{job}/0", node_id=node, **fields)
    return env(payload, at, cluster)


def requeued(
    job: str, reason: str = "preempted; waits again", at: float = T0
) -> events_pb2.Envelope:
    return env(events_pb2.JobRequeued(job_id=job, reason=reason), at)


def preempted(
    job: str, reason: str = "preempted for team-b", at: float = T0
) -> events_pb2.Envelope:
    return env(events_pb2.JobPreempted(job_id=job, reason=reason), at)


def cancelled(
    job: str, reason: str = "cancelled before it started", at: float = T0
) -> events_pb2.Envelope:
    return env(events_pb2.JobCancelled(job_id=job, reason=reason), at)


def registered(
    node: str, gpus: int = 4, cluster: str = "default", at: float = T0
) -> events_pb2.Envelope:
    inventory = types_pb2.NodeInventory(
        node_id=node,
        cluster=cluster,
        gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(gpus)],
        executor=types_pb2.EXECUTOR_SIMULATED,
        source="declared",
    )
    return env(events_pb2.NodeRegistered(inventory=inventory), at, cluster)


def tick(at: float = T0, cluster: str = "default") -> events_pb2.Envelope:
    return env(events_pb2.ClockTick(), at, cluster)
