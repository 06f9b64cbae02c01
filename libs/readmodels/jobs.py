"""The job read model: envelopes folded into ``qm.v1.Job``, whatever order they arrive in.

The projector reads two topics, events and decisions, that are not ordered with
respect to each other: a task can be seen finishing before it is seen placed.
So the fold merges facts rather than replaying transitions. The state only
climbs a rank and terminal states stick; every other field is filled in when
its event arrives, late or not. The outcome of one job's events is the same in
any order, provided they agree on the spec and a job that is still waiting has
one waiting reason (several ``job_pending`` come from one partition, in order).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TypeAlias

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import events_pb2, types_pb2

from libs.events import event_type

_State: TypeAlias = types_pb2.JobState.ValueType

_S = types_pb2.JobState
_RANK: dict[_State, int] = {
    _S.JOB_STATE_UNSPECIFIED: 0,
    _S.JOB_STATE_SUBMITTED: 1,
    _S.JOB_STATE_PENDING: 2,
    _S.JOB_STATE_PLACED: 3,
    _S.JOB_STATE_RUNNING: 4,
    # Terminal. Two terminal claims on one job (a task that finished while a
    # cancellation stopped it) are settled by rank, so arrival order cannot matter.
    _S.JOB_STATE_REJECTED: 5,
    _S.JOB_STATE_FINISHED: 6,
    _S.JOB_STATE_FAILED: 7,
    _S.JOB_STATE_CANCELLED: 8,
}

_JOB_EVENTS = frozenset(
    {
        "job_submitted",
        "job_admitted",
        "job_rejected",
        "job_pending",
        "job_cancelled",
        "task_placed",
        "task_started",
        "task_finished",
        "task_failed",
        "task_stop_requested",
    }
)

DEFAULT_LIST_LIMIT = 100


def job_key(env: events_pb2.Envelope) -> str | None:
    """The id of the job an envelope changes; None when it changes none."""
    kind = event_type(env)
    if kind not in _JOB_EVENTS:
        return None
    job_id: str = getattr(env, kind).job_id
    return job_id or None


def has_ended(job: types_pb2.Job) -> bool:
    """Whether the job is in a terminal state; it never returns to a non-terminal one."""
    return _RANK[job.state] >= _RANK[_S.JOB_STATE_REJECTED]


def apply_job_event(job: types_pb2.Job | None, env: events_pb2.Envelope) -> types_pb2.Job | None:
    """Fold one envelope into a job; returns a new message, never mutates its inputs.

    Any event of a job creates the job when it is unknown (its job_submitted
    may still be on its way); envelopes about no job return ``job`` unchanged.
    """
    job_id = job_key(env)
    if job_id is None:
        return job
    if job is not None and job.job_id != job_id:
        raise ValueError(f"envelope for job {job_id!r} applied to job {job.job_id!r}")
    new = types_pb2.Job(job_id=job_id)
    if job is not None:
        new.CopyFrom(job)
    at = env.occurred_at
    match event_type(env):
        case "job_submitted":
            # The submission is the authority on the spec; other copies only fill gaps.
            if env.job_submitted.HasField("spec"):
                new.spec.CopyFrom(env.job_submitted.spec)
            new.submitted_at.CopyFrom(at)
            _advance(new, _S.JOB_STATE_SUBMITTED)
        case "job_admitted":
            _fill_spec(new, env.job_admitted.spec)
            _advance(new, _S.JOB_STATE_PENDING)
        case "job_rejected":
            rejected = env.job_rejected
            _fill_spec(new, rejected.spec)
            _advance(new, _S.JOB_STATE_REJECTED)
            if new.state == _S.JOB_STATE_REJECTED:
                new.reason = rejected.reason
                new.finished_at.CopyFrom(at)
                if not new.HasField("submitted_at"):  # a rejection is its only event
                    new.submitted_at.CopyFrom(at)
        case "job_pending":
            _advance(new, _S.JOB_STATE_PENDING)
            if new.state == _S.JOB_STATE_PENDING:
                new.reason = env.job_pending.reason
        case "task_placed":
            placed = env.task_placed
            _fill_spec(new, placed.spec)
            _advance(new, _S.JOB_STATE_PLACED)
            new.node_id = placed.node_id
            new.gpu_indices[:] = placed.gpu_indices
        case "task_started":
            _fill_node(new, env.task_started.node_id)
            _advance(new, _S.JOB_STATE_RUNNING)
            new.started_at.CopyFrom(at)
        case "task_finished":
            finished = env.task_finished
            _fill_node(new, finished.node_id)
            _end_task(new, _S.JOB_STATE_FINISHED, finished.exit_code, at)
        case "task_failed":
            failed = env.task_failed
            _fill_node(new, failed.node_id)
            _end_task(new, _S.JOB_STATE_FAILED, failed.exit_code, at)
            new.reason = failed.reason
        case "task_stop_requested":
            stop = env.task_stop_requested
            _fill_node(new, stop.node_id)
            new.stop_reason = stop.reason
            new.stop_cause = stop.cause
            _cancel_if_stopped(new)
        case "job_cancelled":
            _advance(new, _S.JOB_STATE_CANCELLED)
            new.reason = env.job_cancelled.reason
            new.finished_at.CopyFrom(at)
    return new


def newest_jobs(
    jobs: Iterable[types_pb2.Job], *, allocation: str = "", limit: int = DEFAULT_LIST_LIMIT
) -> list[types_pb2.Job]:
    """Jobs of one allocation (all when empty), newest submission first.

    At most ``limit`` of them; 0 means the default, as in ``ListJobsRequest``.
    """
    chosen = (job for job in jobs if not allocation or job.spec.allocation == allocation)
    return heapq.nlargest(
        limit or DEFAULT_LIST_LIMIT,
        chosen,
        key=lambda job: (job.submitted_at.seconds, job.submitted_at.nanos, job.job_id),
    )


def _advance(job: types_pb2.Job, state: _State) -> None:
    """Raise the state to ``state`` unless the job is already there or beyond."""
    if _RANK[state] <= _RANK[job.state]:
        return
    if _RANK[job.state] <= _RANK[_S.JOB_STATE_PENDING]:
        job.reason = ""  # a reason to wait lapses once the job leaves the queue
    job.state = state


def _end_task(job: types_pb2.Job, state: _State, exit_code: int, at: Timestamp) -> None:
    _advance(job, state)
    job.exit_code = exit_code
    job.finished_at.CopyFrom(at)
    _cancel_if_stopped(job)


def _cancel_if_stopped(job: types_pb2.Job) -> None:
    # Checked on both the stop and the task end: whichever arrives last decides.
    ended = job.state in (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)
    if ended and job.stop_cause == types_pb2.STOP_CAUSE_CANCELLED:
        job.state = _S.JOB_STATE_CANCELLED


def _fill_spec(job: types_pb2.Job, spec: types_pb2.JobSpec) -> None:
    if not job.HasField("spec") and spec.ByteSize():
        job.spec.CopyFrom(spec)


def _fill_node(job: types_pb2.Job, node_id: str) -> None:
    if not job.node_id:
        job.node_id = node_id
