"""The job read model: envelopes folded into ``qm.v1.Job``, tolerant of arrival order.

The projector reads two topics, events and decisions, that are not ordered with
respect to each other: a task can be seen finishing before it is seen placed.
So the fold merges facts rather than replaying transitions.

A job runs as a series of placements: a resumable job that is preempted is
requeued and placed again. The scheduler numbers placements from 0 in the task
ids (``<job id>/<n>``, or ``<job id>/<n>.<rank>`` for a gang spanning nodes),
so the fold knows which task is the latest even when a newer task's events
arrive before an older one's. Within the latest task the state only climbs a
rank; an event about an older task changes nothing; the first event about a
newer task starts the job's per-task fields afresh.

How far arrival order may vary:

- A job placed once ends the same in any order, with any repeats, provided its
  events agree on the spec, a job still waiting has one waiting reason, and a
  running task was reported idle or busy once (several ``job_pending`` or
  ``task_idle`` come from one partition, in order).
- ``JobRequeued`` names no task: it ends the latest task if that task was asked
  to stop for preemption, and is otherwise taken for a stale one. Placement
  writes the stop, then the requeue, then the next placement, all on the
  decisions topic; so with that topic read in order, any interleaving with the
  events topic, and a restart that reads either topic's tail again, give the
  same job. A shuffled decisions topic may not. One race remains: a restart
  that repeats a requeue after the next task was already asked to stop ends
  that task early, and a job then preempted for good loses its node and exit code.

A workflow job (its spec holds a workflow the scheduler accepts, see
``libs.events.convert.spec_from_proto``) runs as one task per workflow task,
``<job id>/<task name>``, each on one GPU. The fold keeps each task's facts in
``Job.tasks`` (state climbing by rank, node and GPU, plan, times) and derives the
job from them: PLACED once a task is placed, RUNNING once one starts, FINISHED
when every workflow task finished, FAILED when one failed (the earliest failure
gives the reason and exit code). The job's own ``node_id`` and ``gpu_indices``
stay empty. Derived from a set of facts, the job ends the same in any arrival
order. Before any event carrying the spec arrives, a task id whose last part is
not a placement number (``<n>`` or ``<n>.<rank>``) is taken for a workflow task;
a workflow whose task names look like placement numbers is only recognised once
its spec is seen. Workflow tasks are not requeued: ``JobRequeued`` is ignored.

Kept as records (``JobRecords``), so that folding an event of a workflow of
thousands of tasks costs O(1), in time and in bytes written:

- ``heads``: job id -> ``qm.v1.Job`` with the job's own facts, without its spec
  and without the tasks its workflow names (it keeps any other task: all of
  them while the spec is unknown, and those a workflow does not name);
- ``specs``: job id -> ``qm.v1.Job`` holding only the job's spec, written when
  the spec is first seen (or the submission replaces it);
- ``tasks``: a key of job id and task name -> ``qm.v1.JobTask``, one for each
  task the workflow names.

A workflow job's state and times, derived from its tasks, are derived when the
job is read (``JobRecords.job``), which gives what deriving them after every
event gives: the derived state only climbs, and the times are taken from the
tasks as they are. (Events that disagree on the spec, a workflow in one and
none in another, may end otherwise than the whole-job fold did, which then
depended on the order.) The workflow's task names (checked once per job) are
kept for the jobs folded last. A record that an event leaves as it was is not
written again. The cost left per event is decoding it: a task's placement
carries the job's whole spec.
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections import OrderedDict
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import TypeAlias

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import events_pb2, types_pb2

from libs.events import event_type
from libs.events.convert import workflow_from_proto

_State: TypeAlias = types_pb2.JobState.ValueType

_S = types_pb2.JobState
_RANK: dict[_State, int] = {
    _S.JOB_STATE_UNSPECIFIED: 0,
    _S.JOB_STATE_SUBMITTED: 1,
    _S.JOB_STATE_PENDING: 2,
    _S.JOB_STATE_PLACED: 3,
    _S.JOB_STATE_RUNNING: 4,
    # The task is over. Two claims on one task (a task that finished while a
    # cancellation stopped it) are settled by rank, so arrival order cannot matter.
    _S.JOB_STATE_REJECTED: 5,
    _S.JOB_STATE_FINISHED: 6,
    _S.JOB_STATE_FAILED: 7,
    _S.JOB_STATE_PREEMPTED: 8,
    _S.JOB_STATE_CANCELLED: 9,
    _S.JOB_STATE_LOST: 10,
}
# The job is over for good: no task of it is placed afterwards.
_FINAL = frozenset(
    {_S.JOB_STATE_REJECTED, _S.JOB_STATE_PREEMPTED, _S.JOB_STATE_CANCELLED, _S.JOB_STATE_LOST}
)
# A task that ended on one of these waits for placement's word: requeued or over.
_AWAITING = (types_pb2.STOP_CAUSE_PREEMPTED, types_pb2.STOP_CAUSE_NODE_LOST)

_TASK_EVENTS = frozenset(
    {
        "task_placed",
        "task_started",
        "task_finished",
        "task_failed",
        "task_stop_requested",
        "task_idle",
        "task_lost",
    }
)
_JOB_EVENTS = _TASK_EVENTS | {
    "job_submitted",
    "job_admitted",
    "job_rejected",
    "job_pending",
    "job_cancelled",
    "job_requeued",
    "job_preempted",
    "job_lost",
    "workflow_planned",
}
# A batch job's task ids end in its placement number, and a gang's in the rank too.
_ATTEMPT = re.compile(r"\d+(\.\d+)?")

DEFAULT_LIST_LIMIT = 100


def job_key(env: events_pb2.Envelope) -> str | None:
    """The id of the job an envelope changes; None when it changes none."""
    kind = event_type(env)
    if kind not in _JOB_EVENTS:
        return None
    job_id: str = getattr(env, kind).job_id
    return job_id or None


def task_attempt(task_id: str) -> int:
    """The placement a task belongs to: ``j-1/2`` and, in a gang, ``j-1/2.0`` -> 2.

    0 for an id without that suffix.
    """
    number = task_id.rpartition("/")[2].partition(".")[0]
    return int(number) if number.isascii() and number.isdigit() else 0


def has_ended(job: types_pb2.Job) -> bool:
    """Whether the job is over: no task of it runs now or will be placed later.

    A task that ended after placement asked it to stop for preemption is not the
    end yet: placement still decides between requeueing and ending the job.
    """
    if job.state in _FINAL:
        return True
    task_over = job.state in (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)
    return task_over and job.stop_cause not in _AWAITING


def task_is_over(job: types_pb2.Job, task_id: str) -> bool:
    """Whether the job's events say this task of it no longer runs.

    A task newer than any the job has seen is not over: its events are on their way.
    """
    if job.state in _FINAL:
        return True
    if _is_workflow_task(job, task_id):
        task = _find_task(job, _task_name(job, task_id))
        return task is not None and task.state in (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)
    attempt = task_attempt(task_id)
    latest = job.attempts - 1
    if attempt != latest:
        return attempt < latest
    return _requeued(job) or job.state in (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)


def apply_job_event(job: types_pb2.Job | None, env: events_pb2.Envelope) -> types_pb2.Job | None:
    """Fold one envelope into a job; returns a new message, never mutates its inputs.

    Any event of a job creates the job when it is unknown (its job_submitted
    may still be on its way); envelopes about no job return ``job`` unchanged.
    The whole job in, the whole job out: the projector keeps ``JobRecords``.
    """
    job_id = job_key(env)
    if job_id is None:
        return job
    if job is not None and job.job_id != job_id:
        raise ValueError(f"envelope for job {job_id!r} applied to job {job.job_id!r}")
    records = JobRecords({}, {}, {})
    if job is not None:
        records.load(job)
    records.apply(env)
    return records.job(job_id)


@dataclass(frozen=True)
class _Shape:
    """What a job's spec says of its tasks: whether a spec was seen, and the task
    names of the workflow it runs as, in workflow order (None: it runs none)."""

    known: bool
    names: tuple[str, ...] | None = None
    named: frozenset[str] = field(init=False, repr=False)  # the names, to look up

    def __post_init__(self) -> None:
        object.__setattr__(self, "named", frozenset(self.names or ()))


_NO_SPEC = _Shape(known=False)


class JobRecords:
    """The job read model kept as records (see the module's notes) in three mappings
    of serialized messages: the projector's tables, or dicts.

    Written by one folder (``apply``, ``load``), read by any (``job``, ``jobs``);
    ``remembered``: for how many jobs the workflow's task names are kept.
    """

    def __init__(
        self,
        heads: MutableMapping[str, bytes],
        specs: MutableMapping[str, bytes],
        tasks: MutableMapping[str, bytes],
        *,
        remembered: int = 256,
    ) -> None:
        self.heads = heads
        self.specs = specs
        self.tasks = tasks
        self._remembered = remembered
        self._shapes: OrderedDict[str, _Shape] = OrderedDict()

    # -- reading ---------------------------------------------------------------

    def job(self, job_id: str) -> types_pb2.Job | None:
        """The job as ``apply_job_event`` folds it: spec, tasks in order, derived state."""
        job = self._head(job_id)
        if job is None:
            return None
        spec = self._spec(job_id, job)
        if spec is not None:
            job.spec.CopyFrom(spec)
        shape = self._shape(job_id, job)
        if shape.names is not None:
            inline = {task.name: task for task in job.tasks}
            ordered: list[types_pb2.JobTask] = []
            for name in shape.names:
                data = self.tasks.get(task_key(job_id, name))
                if data is not None:
                    ordered.append(types_pb2.JobTask.FromString(data))
                elif name in inline:  # a record kept before tasks had records of their own
                    ordered.append(_copy(inline.pop(name)))
            ordered += (_copy(task) for task in inline.values())  # by name, as kept
            del job.tasks[:]
            job.tasks.extend(ordered)
            _settle_workflow(job, shape.names)
        elif not shape.known and job.tasks:
            _settle_workflow(job, ())
        return job

    def jobs(self, *, allocation: str = "", limit: int = DEFAULT_LIST_LIMIT) -> list[types_pb2.Job]:
        """Jobs of one allocation (all when empty), newest submission first; see
        ``newest_jobs``. Only the jobs listed are put together with their tasks."""
        listed = []
        for job_id in list(self.heads):
            head = self._head(job_id)
            if head is None:
                continue
            spec = self._spec(job_id, head)
            if spec is not None:
                head.spec.CopyFrom(spec)
            listed.append(head)
        chosen = newest_jobs(listed, allocation=allocation, limit=limit)
        return [job for job in (self.job(c.job_id) for c in chosen) if job is not None]

    # -- folding ---------------------------------------------------------------

    def apply(self, env: events_pb2.Envelope) -> None:
        """Fold one envelope (one about no job changes nothing)."""
        job_id = job_key(env)
        if job_id is None:
            return
        stored = self.heads.get(job_id)
        head = types_pb2.Job(job_id=job_id) if stored is None else _parse_head(stored)
        if head.HasField("spec") and job_id not in self.specs:  # kept with its spec
            self.specs[job_id] = _spec_record(job_id, head.spec)
        head.ClearField("spec")
        kind = event_type(env)
        self._take_spec(job_id, head, kind, env)
        shape = self._shape(job_id, head)
        if shape.named and head.tasks:
            self._file_tasks(job_id, head, shape)  # kept before tasks had records of their own
        if self._is_workflow_event(head, shape, kind, env):
            if kind in _TASK_EVENTS or kind in ("workflow_planned", "job_requeued"):
                self._apply_workflow_event(head, shape, kind, env)
            else:
                _apply_job_event(head, kind, env)
        elif kind in _TASK_EVENTS:
            if _enter_task(head, task_attempt(getattr(env, kind).task_id)):
                _apply_job_event(head, kind, env)
        elif kind != "workflow_planned":  # a plan names a workflow; a spec saying otherwise wins
            _apply_job_event(head, kind, env)
        data = head.SerializeToString(deterministic=True)
        if data != stored:
            self.heads[job_id] = data

    def load(self, job: types_pb2.Job) -> None:
        """Keep a whole job (as ``job`` gives it) as records."""
        head = _copy_job(job)
        head.ClearField("spec")
        if job.HasField("spec"):
            self.specs[job.job_id] = _spec_record(job.job_id, job.spec)
        self._shapes.pop(job.job_id, None)
        shape = self._shape(job.job_id, head)
        if shape.named:
            self._file_tasks(job.job_id, head, shape)
        self.heads[job.job_id] = head.SerializeToString(deterministic=True)

    def forget_cached(self) -> None:
        """Drop what is kept in memory besides the mappings (after they were changed
        by someone else, as a test does)."""
        self._shapes.clear()

    # -- the spec and what it says of the tasks --------------------------------

    def _head(self, job_id: str) -> types_pb2.Job | None:
        data = self.heads.get(job_id)
        return None if data is None else _parse_head(data)

    def _spec(self, job_id: str, head: types_pb2.Job) -> types_pb2.JobSpec | None:
        data = self.specs.get(job_id)
        if data is not None:
            return types_pb2.Job.FromString(data).spec
        return head.spec if head.HasField("spec") else None  # a head kept with its spec

    def _shape(self, job_id: str, head: types_pb2.Job) -> _Shape:
        shape = self._shapes.get(job_id)
        if shape is not None:
            self._shapes.move_to_end(job_id)
            return shape
        spec = self._spec(job_id, head)
        shape = _NO_SPEC if spec is None else _Shape(True, _workflow_names(spec))
        self._shapes[job_id] = shape
        if len(self._shapes) > self._remembered:
            self._shapes.popitem(last=False)
        return shape

    def _take_spec(
        self, job_id: str, head: types_pb2.Job, kind: str, env: events_pb2.Envelope
    ) -> None:
        """The earliest submission is the authority on the spec; other copies only fill
        gaps. A later one is a duplicate request's claim, which lost (admission's
        requests.py): it changes nothing."""
        if kind == "job_submitted":
            if not env.job_submitted.HasField("spec") or not _earliest(head, env):
                return
            spec = env.job_submitted.spec
        elif kind in ("job_admitted", "job_rejected", "task_placed"):
            if self._shape(job_id, head).known:
                return
            if kind == "task_placed" and env.task_placed.HasField("serving"):
                return  # a workflow task's placement leaves the workflow out of its spec
            spec = getattr(env, kind).spec
            if not spec.ByteSize():
                return
        else:
            return
        record = _spec_record(job_id, spec)
        if self.specs.get(job_id) == record:
            return
        before = self._shape(job_id, head)
        self.specs[job_id] = record
        self._shapes.pop(job_id, None)
        after = self._shape(job_id, head)
        # Tasks the old workflow named and the new one does not go back into the head.
        for name in before.names or ():
            key = task_key(job_id, name)
            data = self.tasks.get(key)
            if name not in after.named and data is not None:
                _keep_inline(head, types_pb2.JobTask.FromString(data))
                del self.tasks[key]
        self._file_tasks(job_id, head, after)

    def _file_tasks(self, job_id: str, head: types_pb2.Job, shape: _Shape) -> None:
        """Give the tasks the workflow names records of their own."""
        kept = []
        for task in head.tasks:
            if task.name in shape.named:
                self._put_task(job_id, task)
            else:
                kept.append(_copy(task))
        if len(kept) < len(head.tasks):
            del head.tasks[:]
            head.tasks.extend(kept)

    # -- workflow tasks --------------------------------------------------------

    def _is_workflow_event(
        self, head: types_pb2.Job, shape: _Shape, kind: str, env: events_pb2.Envelope
    ) -> bool:
        if shape.known:
            return shape.names is not None
        if kind == "workflow_planned" or head.tasks:
            return True
        if kind == "task_placed" and env.task_placed.HasField("serving"):
            return True
        return kind in _TASK_EVENTS and _is_workflow_task(head, getattr(env, kind).task_id)

    def _task(
        self, job_id: str, head: types_pb2.Job, shape: _Shape, name: str
    ) -> types_pb2.JobTask:
        """The task to change: a copy of its record (``_put_task`` it back) or, for a
        task the workflow does not name, the head's own (kept in order of name)."""
        if name in shape.named:
            data = self.tasks.get(task_key(job_id, name))
            return (
                types_pb2.JobTask(name=name) if data is None else types_pb2.JobTask.FromString(data)
            )
        return _keep_inline(head, types_pb2.JobTask(name=name), replace=False)

    def _put_task(self, job_id: str, task: types_pb2.JobTask) -> None:
        key = task_key(job_id, task.name)
        data = task.SerializeToString(deterministic=True)
        if self.tasks.get(key) != data:
            self.tasks[key] = data

    def _apply_workflow_event(
        self, head: types_pb2.Job, shape: _Shape, kind: str, env: events_pb2.Envelope
    ) -> None:
        job_id = head.job_id

        def put(task: types_pb2.JobTask) -> None:
            if task.name in shape.named:
                self._put_task(job_id, task)

        at = env.occurred_at
        match kind:
            case "workflow_planned":
                for planned in env.workflow_planned.tasks:
                    task = self._task(job_id, head, shape, planned.name)
                    task.planned_node_id = planned.node_id
                    task.planned_gpu_index = planned.gpu_index
                    _advance_task(task, _S.JOB_STATE_PENDING)
                    put(task)
                _advance(head, _S.JOB_STATE_PENDING)
            case "job_requeued":
                pass  # the scheduler does not requeue workflow tasks
            case "task_placed":
                placed = env.task_placed
                name = placed.serving.name or _task_name(head, placed.task_id)
                task = self._task(job_id, head, shape, name)
                _advance_task(task, _S.JOB_STATE_PLACED)
                task.node_id = placed.node_id
                task.gpu_index = placed.gpu_indices[0] if placed.gpu_indices else 0
                if placed.serving.planned_node_id:  # adjusted away from its plan
                    task.planned_node_id = placed.serving.planned_node_id
                    task.planned_gpu_index = placed.serving.planned_gpu_index
                put(task)
            case _:  # a report on one task: started, ended, asked to stop, idle or busy
                report = getattr(env, kind)
                task = self._task(job_id, head, shape, _task_name(head, report.task_id))
                _fill_task_node(task, report.node_id)
                if kind == "task_started":
                    _advance_task(task, _S.JOB_STATE_RUNNING)
                    task.started_at.CopyFrom(at)  # a fact even when its end was seen first
                elif kind in ("task_finished", "task_failed", "task_lost"):
                    failed = kind != "task_finished"
                    end = _S.JOB_STATE_FAILED if failed else _S.JOB_STATE_FINISHED
                    if _advance_task(task, end):
                        task.exit_code = -1 if kind == "task_lost" else report.exit_code
                        if failed:
                            task.reason = report.reason
                        task.finished_at.CopyFrom(at)
                elif kind == "task_stop_requested":
                    _advance_task(task, _S.JOB_STATE_PLACED)  # only a placed task is stopped
                    head.stop_reason = report.reason
                    head.stop_cause = report.cause
                else:  # task_idle
                    _advance_task(task, _S.JOB_STATE_RUNNING)  # only a running task is measured
                put(task)


def task_key(job_id: str, name: str) -> str:
    """The key of a workflow task's record: the job id's length first, so that no two
    jobs' tasks share one whatever their ids and names hold."""
    return f"{len(job_id)}:{job_id}/{name}"


def _parse_head(data: bytes) -> types_pb2.Job:
    return types_pb2.Job.FromString(data)


def _spec_record(job_id: str, spec: types_pb2.JobSpec) -> bytes:
    record = types_pb2.Job(job_id=job_id)
    record.spec.CopyFrom(spec)
    return record.SerializeToString(deterministic=True)


def _copy(task: types_pb2.JobTask) -> types_pb2.JobTask:
    copy = types_pb2.JobTask()
    copy.CopyFrom(task)
    return copy


def _copy_job(job: types_pb2.Job) -> types_pb2.Job:
    copy = types_pb2.Job()
    copy.CopyFrom(job)
    return copy


def _keep_inline(
    head: types_pb2.Job, task: types_pb2.JobTask, *, replace: bool = True
) -> types_pb2.JobTask:
    """The head's task of ``task``'s name, added in order of name if missing (set to
    ``task`` when ``replace``); returned as held by the head, to be changed there."""
    names = [t.name for t in head.tasks]
    at = bisect.bisect_left(names, task.name)
    if at < len(names) and names[at] == task.name:
        if replace:
            head.tasks[at].CopyFrom(task)
        return head.tasks[at]
    kept = [_copy(t) for t in head.tasks]
    kept.insert(at, task)
    del head.tasks[:]
    head.tasks.extend(kept)
    return head.tasks[at]


def _apply_job_event(new: types_pb2.Job, kind: str, env: events_pb2.Envelope) -> None:
    at = env.occurred_at
    match kind:
        case "job_submitted":  # the spec is JobRecords' to keep
            if _earliest(new, env):
                new.submitted_at.CopyFrom(at)
            _advance(new, _S.JOB_STATE_SUBMITTED)
        case "job_admitted":
            _advance(new, _S.JOB_STATE_PENDING)
        case "job_rejected":
            rejected = env.job_rejected
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
            # Why a preempted job ended is the preemption, not the signal that carried it out.
            if new.state != _S.JOB_STATE_PREEMPTED:
                new.reason = failed.reason
        case "task_stop_requested":
            stop = env.task_stop_requested
            _fill_node(new, stop.node_id)
            _advance(new, _S.JOB_STATE_PLACED)  # only a placed task is stopped
            new.stop_reason = stop.reason
            new.stop_cause = stop.cause
            _cancel_if_stopped(new)
        case "task_lost":
            gone = env.task_lost
            _fill_node(new, gone.node_id)
            if not new.stop_cause:  # a stop already on its way says why it ends
                new.stop_cause = types_pb2.STOP_CAUSE_NODE_LOST
                new.stop_reason = gone.reason
            _end_task(new, _S.JOB_STATE_FAILED, -1, at)
            if new.state == _S.JOB_STATE_FAILED:
                new.reason = gone.reason
        case "task_idle":
            idle = env.task_idle
            _fill_node(new, idle.node_id)
            _advance(new, _S.JOB_STATE_RUNNING)  # only a running task is measured
            # A report read after the task's end describes GPUs it no longer holds.
            if new.state == _S.JOB_STATE_RUNNING:
                new.idle = idle.idle
        case "job_cancelled":
            _advance(new, _S.JOB_STATE_CANCELLED)
            new.reason = env.job_cancelled.reason
            new.finished_at.CopyFrom(at)
        case "job_requeued":
            # A requeue follows the stop it answers. Without one, it is about an
            # older task (a newer one showed up first), or a repeat that can only
            # restate why the job waits.
            preempted_task = new.stop_cause in _AWAITING
            if new.state not in _FINAL and (preempted_task or _requeued(new)):
                _clear_task(new)
                new.state = _S.JOB_STATE_PENDING
                new.reason = env.job_requeued.reason
        case "job_preempted" | "job_lost":
            state = _S.JOB_STATE_PREEMPTED if kind == "job_preempted" else _S.JOB_STATE_LOST
            _advance(new, state)
            if new.state == state:
                new.reason = getattr(env, kind).reason
                if not new.HasField("finished_at"):  # the task's own end says it better
                    new.finished_at.CopyFrom(at)


def _earliest(job: types_pb2.Job, env: events_pb2.Envelope) -> bool:
    """Whether this submission is the earliest seen of the job (the others are claims of
    duplicate requests, which lost); by time, so that any arrival order agrees."""
    seen = job.HasField("submitted_at")
    return not seen or _time(env.occurred_at) < _time(job.submitted_at)


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


def _requeued(job: types_pb2.Job) -> bool:
    """Whether a requeue closed the latest task: the job waits, or was cancelled waiting.

    Only a requeue brings a placed job back to PENDING. A job cancelled while its
    task ran was stopped for it (stop cause CANCELLED); one cancelled while
    waiting after a requeue has no stop cause, the requeue having cleared it.
    """
    if job.attempts == 0:
        return False
    cancelled_waiting = (
        job.state == _S.JOB_STATE_CANCELLED and job.stop_cause == types_pb2.STOP_CAUSE_UNSPECIFIED
    )
    return job.state == _S.JOB_STATE_PENDING or cancelled_waiting


def _enter_task(job: types_pb2.Job, attempt: int) -> bool:
    """Make ``attempt`` the job's latest task if it is newer; False when it is stale.

    Every task event raises the state to PLACED at least, so a job with attempts
    is only PENDING again after a requeue, which closes its latest task.
    """
    latest = job.attempts - 1
    if attempt < latest or (attempt == latest and _requeued(job)):
        return False
    if attempt > latest and job.attempts > 0:
        if job.state in _FINAL:
            return False  # no task is placed after the end; nothing newer can follow
        _clear_task(job)
        job.state = _S.JOB_STATE_PENDING
    job.attempts = max(job.attempts, attempt + 1)
    return True


def _clear_task(job: types_pb2.Job) -> None:
    """Forget the fields that describe one task, keeping those of the job."""
    for name in (
        "reason",
        "node_id",
        "gpu_indices",
        "exit_code",
        "started_at",
        "finished_at",
        "stop_reason",
        "stop_cause",
        "idle",
    ):
        job.ClearField(name)


def _advance(job: types_pb2.Job, state: _State) -> None:
    """Raise the state to ``state`` unless the job is already there or beyond."""
    if _RANK[state] <= _RANK[job.state]:
        return
    if _RANK[job.state] <= _RANK[_S.JOB_STATE_PENDING]:
        job.reason = ""  # a reason to wait lapses once the job leaves the queue
    if _RANK[state] > _RANK[_S.JOB_STATE_RUNNING]:
        job.idle = False  # only a running task holds GPUs that can sit idle
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


def _fill_node(job: types_pb2.Job, node_id: str) -> None:
    if not job.node_id:
        job.node_id = node_id


# -- workflow jobs -------------------------------------------------------------


def _workflow_names(spec: types_pb2.JobSpec) -> tuple[str, ...] | None:
    """The task names of the job's workflow in workflow order; None when the scheduler
    does not run the job as a workflow (no workflow, or one that breaks a DAG rule)."""
    if not spec.HasField("workflow"):
        return None
    workflow = workflow_from_proto(spec.workflow)
    return None if workflow is None else tuple(t.task_id for t in workflow.tasks)


def _task_name(job: types_pb2.Job, task_id: str) -> str:
    return task_id.removeprefix(f"{job.job_id}/")


def _is_workflow_task(job: types_pb2.Job, task_id: str) -> bool:
    """Whether a task of this job is a workflow task; see the module's notes for a job
    whose spec is not known yet."""
    if job.HasField("spec"):
        return _workflow_names(job.spec) is not None
    return bool(job.tasks) or not _ATTEMPT.fullmatch(_task_name(job, task_id))


def _find_task(job: types_pb2.Job, name: str) -> types_pb2.JobTask | None:
    return next((t for t in job.tasks if t.name == name), None)


def _advance_task(task: types_pb2.JobTask, state: _State) -> bool:
    """Raise a task's state; whether it is now ``state`` (False: it was already beyond)."""
    if _RANK[state] > _RANK[task.state]:
        task.state = state
    return task.state == state


def _fill_task_node(task: types_pb2.JobTask, node_id: str) -> None:
    if not task.node_id:
        task.node_id = node_id


def _settle_workflow(job: types_pb2.Job, names: tuple[str, ...]) -> None:
    """Derive the job's state and times from its tasks (``names``: its workflow's)."""
    tasks = list(job.tasks)
    failed = [t for t in tasks if t.state == _S.JOB_STATE_FAILED]
    finished = [t for t in tasks if t.state == _S.JOB_STATE_FINISHED]
    derived: _State | None = None
    if failed:
        derived = _S.JOB_STATE_FAILED
    elif names and {t.name for t in finished} >= set(names):
        derived = _S.JOB_STATE_FINISHED
    elif finished or any(t.state == _S.JOB_STATE_RUNNING for t in tasks):
        derived = _S.JOB_STATE_RUNNING
    elif any(t.state == _S.JOB_STATE_PLACED for t in tasks):
        derived = _S.JOB_STATE_PLACED
    if derived is not None:
        _advance(job, derived)
    starts = [t.started_at for t in tasks if t.HasField("started_at")]
    if starts:
        job.started_at.CopyFrom(min(starts, key=_time))
    if derived == _S.JOB_STATE_FINISHED and job.state == derived:
        job.exit_code = 0
        job.finished_at.CopyFrom(max((t.finished_at for t in finished), key=_time))
    elif derived == _S.JOB_STATE_FAILED and job.state == derived:
        first = min(failed, key=lambda t: (_time(t.finished_at), t.name))
        job.exit_code = first.exit_code
        job.reason = f"task {first.name} failed" + (f": {first.reason}" if first.reason else "")
        job.finished_at.CopyFrom(first.finished_at)
    _cancel_if_stopped(job)


def _time(ts: Timestamp) -> tuple[int, int]:
    return (ts.seconds, ts.nanos)
