"""The job read model: envelopes folded into ``qm.v1.Job`` by the rules of
``libs.readmodels.job_state``, kept as records (``JobRecords``) so that folding an
event of a workflow of thousands of tasks costs O(1), in time and in bytes written:

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
import dataclasses
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable, MutableMapping
from dataclasses import KW_ONLY, dataclass, field

from qm.v1 import events_pb2, types_pb2

from libs.core.budget_tree import BudgetTree
from libs.core.ids import array_of, attempt_of, name_in_job
from libs.events import event_type
from libs.readmodels.job_state import (
    JOB_EVENTS,
    TASK_EVENTS,
    WAITING,
    advance,
    advance_task,
    earliest,
    enter_task,
    fill_task_node,
    fold_event,
    is_workflow_task,
    note_placed,
    note_stop,
    settle_workflow,
    workflow_names,
)

_S = types_pb2.JobState
DEFAULT_LIST_LIMIT = 100


def job_key(env: events_pb2.Envelope) -> str | None:
    """The id of the job an envelope changes; None when it changes none."""
    kind = event_type(env)
    if kind not in JOB_EVENTS:
        return None
    job_id: str = getattr(env, kind).job_id
    return job_id or None


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


@dataclass(frozen=True)
class JobFilter:
    """What a list of jobs asks for; an empty field asks for any. It picks within a
    ``Scope``, never beyond it."""

    allocation: str = ""
    user: str = ""
    states: frozenset[types_pb2.JobState.ValueType] = frozenset()
    array_id: str = ""  # a job array's: its elements

    def matches(self, job: types_pb2.Job) -> bool:
        return (
            (not self.allocation or job.spec.allocation == self.allocation)
            and (not self.user or job.spec.user == self.user)
            and (not self.states or job.state in self.states)
            and (not self.array_id or array_of(job.job_id) == self.array_id)
        )


ALL_JOBS = JobFilter()


@dataclass(eq=False, repr=False)  # its mappings are whole tables
class JobRecords:
    """The job read model kept as records (see the module's notes) in three mappings
    of serialized messages: the projector's tables, or dicts.

    Written by one folder (``apply``, ``load``), read by any (``job``, ``jobs``);
    ``remembered``: for how many jobs the workflow's task names are kept.
    """

    heads: MutableMapping[str, bytes]
    specs: MutableMapping[str, bytes]
    tasks: MutableMapping[str, bytes]
    _: KW_ONLY
    remembered: int = 256
    _shapes: OrderedDict[str, _Shape] = field(default_factory=OrderedDict, init=False)

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
            settle_workflow(job, shape.names)
        elif not shape.known and job.tasks:
            settle_workflow(job, ())
        return job

    def jobs(
        self,
        *,
        where: JobFilter = ALL_JOBS,
        limit: int = DEFAULT_LIST_LIMIT,
        scope: Scope | None = None,
    ) -> list[types_pb2.Job]:
        """The jobs ``where`` asks for within ``scope``, newest submission first; see
        ``newest_jobs``. Only the jobs listed are put together with their tasks."""
        listed = self.heads_with_specs()
        if not where.states:
            chosen = newest_jobs(listed, where=where, limit=limit, scope=scope)
            return [job for job in (self.job(c.job_id) for c in chosen) if job is not None]
        # A workflow's state is derived from its tasks: judged on the whole job.
        unstated = dataclasses.replace(where, states=frozenset())
        candidates = newest_jobs(listed, where=unstated, limit=len(listed), scope=scope)
        whole = (self.job(c.job_id) for c in candidates)
        matching = (job for job in whole if job is not None and where.matches(job))
        return list(itertools.islice(matching, limit or DEFAULT_LIST_LIMIT))

    def heads_with_specs(self) -> list[types_pb2.Job]:
        """Every job's head (state, placement, idleness) with its spec, without its tasks."""
        listed = []
        for job_id in list(self.heads):
            head = self._head(job_id)
            if head is None:
                continue
            spec = self._spec(job_id, head)
            if spec is not None:
                head.spec.CopyFrom(spec)
            listed.append(head)
        return listed

    def task_node(self, job_id: str, task_id: str) -> str | None:
        """The node a task of the job's latest placement, or a workflow task, runs on:
        where placement placed it (or, its placement not read yet, where its node first
        reported it from); None when unknown. What a reader checks a node's report on a
        task against (``libs.trust.gate``)."""
        head = self._head(job_id)
        if head is None:
            return None
        for part in head.placements:
            if part.task_id == task_id:
                return part.node_id or None
        name = name_in_job(job_id, task_id)
        data = self.tasks.get(task_key(job_id, name))
        tasks = [types_pb2.JobTask.FromString(data)] if data is not None else head.tasks
        return next((task.node_id for task in tasks if task.name == name and task.node_id), None)

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
            if kind in TASK_EVENTS or kind in ("workflow_planned", "job_requeued"):
                self._apply_workflow_event(head, shape, kind, env)
            else:
                fold_event(head, kind, env)
        elif kind in TASK_EVENTS:
            if kind == "task_placed":
                note_placed(head, env.task_placed)
            if enter_task(head, attempt_of(getattr(env, kind).task_id)):
                fold_event(head, kind, env)
        elif kind != "workflow_planned":  # a plan names a workflow; a spec saying otherwise wins
            fold_event(head, kind, env)
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
        shape = _NO_SPEC if spec is None else _Shape(True, workflow_names(spec))
        self._shapes[job_id] = shape
        if len(self._shapes) > self.remembered:
            self._shapes.popitem(last=False)
        return shape

    def _take_spec(
        self, job_id: str, head: types_pb2.Job, kind: str, env: events_pb2.Envelope
    ) -> None:
        """The earliest submission is the authority on the spec, until an update of the
        waiting job replaces it; other copies only fill gaps. A later submission is a
        duplicate request's claim, which lost (admission's requests.py): it changes
        nothing."""
        if kind == "job_submitted":
            if not env.job_submitted.HasField("spec") or not earliest(head, env):
                return
            spec = env.job_submitted.spec
        elif kind == "job_updated":
            # Placement takes an update only while the job waits (else it refuses it).
            if head.state not in WAITING:
                return
            spec = env.job_updated.spec
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
        return kind in TASK_EVENTS and is_workflow_task(head, getattr(env, kind).task_id)

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
                    advance_task(task, _S.JOB_STATE_PENDING)
                    put(task)
                advance(head, _S.JOB_STATE_PENDING)
            case "job_requeued":
                pass  # the scheduler does not requeue workflow tasks
            case "task_placed":
                placed = env.task_placed
                name = placed.serving.name or name_in_job(job_id, placed.task_id)
                task = self._task(job_id, head, shape, name)
                advance_task(task, _S.JOB_STATE_PLACED)
                task.node_id = placed.node_id
                task.gpu_index = placed.gpu_indices[0] if placed.gpu_indices else 0
                if placed.serving.planned_node_id:  # adjusted away from its plan
                    task.planned_node_id = placed.serving.planned_node_id
                    task.planned_gpu_index = placed.serving.planned_gpu_index
                put(task)
                # The head alone says the workflow waits no more (``job`` derives the rest
                # from its tasks): what counts waiting jobs reads heads only.
                advance(head, _S.JOB_STATE_PLACED)
            case _:  # a report on one task: started, ended, asked to stop, idle or busy
                report = getattr(env, kind)
                task = self._task(job_id, head, shape, name_in_job(job_id, report.task_id))
                fill_task_node(task, report.node_id)
                if kind == "task_started":
                    advance_task(task, _S.JOB_STATE_RUNNING)
                    task.started_at.CopyFrom(at)  # a fact even when its end was seen first
                elif kind in ("task_finished", "task_failed", "task_lost"):
                    failed = kind != "task_finished"
                    end = _S.JOB_STATE_FAILED if failed else _S.JOB_STATE_FINISHED
                    if advance_task(task, end):
                        task.exit_code = -1 if kind == "task_lost" else report.exit_code
                        if failed:
                            task.reason = report.reason
                        task.finished_at.CopyFrom(at)
                elif kind == "task_stop_requested":
                    advance_task(task, _S.JOB_STATE_PLACED)  # only a placed task is stopped
                    note_stop(head, report)
                else:  # task_idle
                    advance_task(task, _S.JOB_STATE_RUNNING)  # only a running task is measured
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


@dataclass(frozen=True)
class Scope:
    """The jobs one caller may see: their own, and those of ``allocations``."""

    user: str
    allocations: frozenset[str] = frozenset()

    def admits(self, job: types_pb2.Job) -> bool:
        return job.spec.user == self.user or job.spec.allocation in self.allocations


def scope_of(user: str, tree: BudgetTree, operators: Collection[str]) -> Scope | None:
    """The jobs ``user`` may see; None: every job (``operators``, the root's managers)."""
    if user in operators or tree.sees_all(user):
        return None
    return Scope(user, tree.visible_to(user))


def newest_jobs(
    jobs: Iterable[types_pb2.Job],
    *,
    where: JobFilter = ALL_JOBS,
    limit: int = DEFAULT_LIST_LIMIT,
    scope: Scope | None = None,
) -> list[types_pb2.Job]:
    """The jobs ``where`` asks for that ``scope`` admits (all when None), newest
    submission first.

    At most ``limit`` of them; 0 means the default, as in ``ListJobsRequest``.
    """
    chosen = (job for job in jobs if where.matches(job) and (scope is None or scope.admits(job)))
    return heapq.nlargest(
        limit or DEFAULT_LIST_LIMIT,
        chosen,
        key=lambda job: (job.submitted_at.seconds, job.submitted_at.nanos, job.job_id),
    )
