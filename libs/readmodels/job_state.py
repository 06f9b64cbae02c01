"""The rules of one job's state: an envelope folded into ``qm.v1.Job``, in any arrival order.

The projector reads two topics, events and decisions, that are not ordered with
respect to each other: a task can be seen finishing before it is seen placed.
So the fold merges facts rather than replaying transitions.

A job runs as a series of placements: a resumable job that is preempted is
requeued and placed again. The scheduler numbers placements from 0 in the task
ids (``<job id>/<n>``, or ``<job id>/<n>.<rank>`` for a gang spanning nodes),
so the fold knows which task is the latest even when a newer task's events
arrive before an older one's. Within the latest task the state only climbs a
rank; an event about an older task changes nothing; the first event about a
newer task starts the job's per-task fields afresh. The latest placement's tasks
are kept in ``Job.placements`` in rank order (a gang runs one per node; its
``<n>.<rank>`` tasks may be seen in any order), and the job's own node and GPUs
are its first task's. The job is derived from its placement's tasks: RUNNING
once every one started (a gang lives and dies as one; its ``started_at`` is
still its first start), ended once every one ended. A stop that ends the job for
good decides how it ends, whether it arrives before or after the tasks' ends:
for cancellation CANCELLED, for the time limit TIMEOUT (the stop says why); a
gang stopped because a part failed ends FAILED with the first failed part's
exit code, and the stop says why. The fold does not know which parts were
stopped: the first to fail is the first to end by its node's clock, so nodes
whose clocks disagree by more than placement takes to stop the rest may give a
stopped part's exit code (never its reason).

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

``libs.readmodels.jobs`` keeps the model as records and folds through these rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import events_pb2, types_pb2

from libs.core.ids import attempt_of, gang_rank, is_batch_task_id, name_in_job
from libs.events.convert import workflow_from_proto

State: TypeAlias = types_pb2.JobState.ValueType

_S = types_pb2.JobState
# Waiting: submitted, not yet placed (held or not). What the queue shows, what the
# projector's metrics count as waiting jobs and the console as asked-for demand.
WAITING: frozenset[State] = frozenset({_S.JOB_STATE_SUBMITTED, _S.JOB_STATE_PENDING})
_RANK: dict[State, int] = {
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
    # Above CANCELLED: placement does not stop a job being stopped again, so a job
    # cancelled while timing out times out.
    _S.JOB_STATE_TIMEOUT: 11,
}
# The job is over for good: no task of it is placed afterwards.
_FINAL = frozenset(
    {
        _S.JOB_STATE_REJECTED,
        _S.JOB_STATE_PREEMPTED,
        _S.JOB_STATE_CANCELLED,
        _S.JOB_STATE_LOST,
        _S.JOB_STATE_TIMEOUT,
    }
)
# A task that ended on one of these waits for placement's word: requeued or over.
_AWAITING = (
    types_pb2.STOP_CAUSE_PREEMPTED,
    types_pb2.STOP_CAUSE_NODE_LOST,
    types_pb2.STOP_CAUSE_DRAINED,
)
# A stop that ends the job for good, and how the job ends once its tasks have.
_STOP_ENDS: dict[types_pb2.StopCause.ValueType, State] = {
    types_pb2.STOP_CAUSE_CANCELLED: _S.JOB_STATE_CANCELLED,
    types_pb2.STOP_CAUSE_TIME_LIMIT: _S.JOB_STATE_TIMEOUT,
}

TASK_EVENTS = frozenset(
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
JOB_EVENTS = TASK_EVENTS | {
    "task_checkpointed",  # of any attempt: kept for the job
    "job_submitted",
    "job_held",
    "job_updated",
    "job_admitted",
    "job_rejected",
    "job_pending",
    "job_cancelled",
    "job_requeued",
    "job_preempted",
    "job_lost",
    "workflow_planned",
}


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
    return ended_tasks(job)(task_id)


def ended_tasks(job: types_pb2.Job) -> Callable[[str], bool]:
    """``task_is_over`` for many tasks of one job at the cost of one: the job's workflow
    is read once, not once per task (a node view may list thousands of its tasks)."""
    if job.state in _FINAL:
        return lambda _task_id: True
    known = job.HasField("spec")
    workflow = known and workflow_names(job.spec) is not None
    ended = (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)
    done = frozenset(t.name for t in job.tasks if t.state in ended)
    latest = job.attempts - 1
    latest_over = _requeued(job) or job.state in ended

    def over(task_id: str) -> bool:
        name = name_in_job(job.job_id, task_id)
        # As is_workflow_task, with the workflow read once.
        if workflow if known else (bool(job.tasks) or not is_batch_task_id(job.job_id, task_id)):
            return name in done
        attempt = attempt_of(task_id)
        return attempt < latest if attempt != latest else latest_over

    return over


def fold_event(new: types_pb2.Job, kind: str, env: events_pb2.Envelope) -> None:
    at = env.occurred_at
    match kind:
        case "job_submitted":  # the spec is JobRecords' to keep
            if earliest(new, env):
                new.submitted_at.CopyFrom(at)
            advance(new, _S.JOB_STATE_SUBMITTED)
        case "job_admitted":
            advance(new, _S.JOB_STATE_PENDING)
        case "job_rejected":
            rejected = env.job_rejected
            advance(new, _S.JOB_STATE_REJECTED)
            if new.state == _S.JOB_STATE_REJECTED:
                new.reason = rejected.reason
                new.finished_at.CopyFrom(at)
                if not new.HasField("submitted_at"):  # a rejection is its only event
                    new.submitted_at.CopyFrom(at)
        case "job_pending":
            advance(new, _S.JOB_STATE_PENDING)
            if new.state == _S.JOB_STATE_PENDING:
                new.reason, new.wait_code = env.job_pending.reason, env.job_pending.code
        case "job_held" if new.state in WAITING:
            new.held = env.job_held.held  # placement refuses to hold a job that has started
        case "task_placed":
            advance(new, _S.JOB_STATE_PLACED)
            new.held = False
            _place(new, env.task_placed)
            _protect(new, env.task_placed)
        case "task_started":
            begun = env.task_started
            _fill_node(new, begun.node_id)
            advance(new, _S.JOB_STATE_PLACED)
            advance_task(_part(new, begun.task_id, begun.node_id), _S.JOB_STATE_RUNNING)
            if not new.HasField("started_at") or _time(at) < _time(new.started_at):
                new.started_at.CopyFrom(at)  # a gang's contract runs from its first start
            _protect(new)
            _settle_parts(new)
        case "task_finished":
            finished = env.task_finished
            _fill_node(new, finished.node_id)
            part = _part(new, finished.task_id, finished.node_id)
            _end_part(new, part, _S.JOB_STATE_FINISHED, finished.exit_code, "", at)
        case "task_failed":
            failed = env.task_failed
            _fill_node(new, failed.node_id)
            part = _part(new, failed.task_id, failed.node_id)
            _end_part(new, part, _S.JOB_STATE_FAILED, failed.exit_code, failed.reason, at)
        case "task_stop_requested":
            stop = env.task_stop_requested
            _fill_node(new, stop.node_id)
            advance(new, _S.JOB_STATE_PLACED)  # only a placed task is stopped
            note_stop(new, stop)
            _part(new, stop.task_id, stop.node_id).stop_requested = True
            if stop.HasField("preemption"):
                new.preemption.CopyFrom(stop.preemption)
            _settle_parts(new)  # the stop may come after the ends: it still says how it ends
        case "task_lost":
            gone = env.task_lost
            _fill_node(new, gone.node_id)
            if not new.stop_cause:  # a stop already on its way says why it ends
                new.stop_cause = types_pb2.STOP_CAUSE_NODE_LOST
                new.stop_reason = gone.reason
            part = _part(new, gone.task_id, gone.node_id)
            _end_part(new, part, _S.JOB_STATE_FAILED, -1, gone.reason, at)
        case "task_idle":
            idle = env.task_idle
            _fill_node(new, idle.node_id)
            advance(new, _S.JOB_STATE_PLACED)
            part = _part(new, idle.task_id, idle.node_id)
            advance_task(part, _S.JOB_STATE_RUNNING)  # only a running task is measured
            _settle_parts(new)
            # A report read after the job's end describes GPUs it no longer holds; one
            # read before the rest of its gang started, GPUs it holds still.
            if _RANK[new.state] <= _RANK[_S.JOB_STATE_RUNNING]:
                new.idle = idle.idle
        case "task_checkpointed":
            if not new.HasField("checkpointed_at") or _time(at) > _time(new.checkpointed_at):
                new.checkpointed_at.CopyFrom(at)
        case "job_cancelled":
            advance(new, _S.JOB_STATE_CANCELLED)
            if new.state == _S.JOB_STATE_CANCELLED:
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
            advance(new, state)
            if new.state == state:
                new.reason = getattr(env, kind).reason
                if not new.HasField("finished_at"):  # the task's own end says it better
                    new.finished_at.CopyFrom(at)


def earliest(job: types_pb2.Job, env: events_pb2.Envelope) -> bool:
    """Whether this submission is the earliest seen of the job (the others are claims of
    duplicate requests, which lost); by time, so that any arrival order agrees."""
    seen = job.HasField("submitted_at")
    return not seen or _time(env.occurred_at) < _time(job.submitted_at)


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


def enter_task(job: types_pb2.Job, attempt: int) -> bool:
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
        "placements",
        "protection",
        "protected_for",
        "protected_until",
    ):
        job.ClearField(name)


def _place(job: types_pb2.Job, placed: events_pb2.TaskPlaced) -> None:
    """Keep where one task of the latest placement runs, in rank order (a gang's tasks
    may be seen in any order, their ends before their placements); the job's own node
    is its first task's."""
    part = _part(job, placed.task_id, placed.node_id)
    part.node_id = placed.node_id
    part.gpu_indices[:] = placed.gpu_indices
    advance_task(part, _S.JOB_STATE_PLACED)
    first = job.placements[0]
    job.node_id = first.node_id
    job.gpu_indices[:] = first.gpu_indices
    job.parts = _parts(job, placed.spec.gpus)
    _settle_parts(job)


def _parts(job: types_pb2.Job, gpus: int) -> int:
    """How many tasks the placement has: one, or for a gang of ``gpus`` one per whole node
    (each part but the last has a node's GPUs, so the largest part seen gives the count;
    seeing only the last one counts more, and the job waits for parts that exist)."""
    if gang_rank(job.placements[0].task_id) is None:
        return 1
    largest = max(len(p.gpu_indices) for p in job.placements)
    return -(-gpus // largest) if largest else 0


def note_placed(job: types_pb2.Job, placed: events_pb2.TaskPlaced) -> None:
    """Keep every node a task of the job was placed on, over all its attempts (where its
    output may be), from any placement, stale or not: sorted, so any order agrees. None
    is placed after the end (``enter_task``)."""
    after_the_end = job.state in _FINAL and 0 < job.attempts <= attempt_of(placed.task_id)
    if placed.node_id not in job.placed_on and not after_the_end:
        job.placed_on[:] = sorted((*job.placed_on, placed.node_id))


def _part(job: types_pb2.Job, task_id: str, node_id: str) -> types_pb2.JobPlacement:
    """The latest placement's task ``task_id``, kept in rank order; added (on ``node_id``)
    when its placement has not been seen yet."""
    for part in job.placements:
        if part.task_id == task_id:
            return part
    kept = [*job.placements, types_pb2.JobPlacement(task_id=task_id, node_id=node_id)]
    kept.sort(key=lambda p: (gang_rank(p.task_id) or 0, p.task_id))
    del job.placements[:]
    job.placements.extend(kept)
    return next(p for p in job.placements if p.task_id == task_id)


def _end_part(
    job: types_pb2.Job,
    part: types_pb2.JobPlacement,
    state: State,
    exit_code: int,
    reason: str,
    at: Timestamp,
) -> None:
    """One task of the job ended; the job ends with its last (``_settle_parts``)."""
    if advance_task(part, state):
        part.exit_code, part.reason = exit_code, reason
        part.finished_at.CopyFrom(at)
    advance(job, _S.JOB_STATE_PLACED)
    _settle_parts(job)


def _settle_parts(job: types_pb2.Job) -> None:
    """Derive the job from the tasks of its placement, once every one was seen: RUNNING
    once every one started (a task that ended did); once every one ended, FAILED if any
    part failed, with the exit code and reason of the first to fail (the stop's reason
    where placement stopped the rest of a gang for it), else FINISHED; at the last end.
    A gang's parts start and end one by one, in any order of their records."""
    ended = (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED)
    single = bool(job.placements) and gang_rank(job.placements[0].task_id) is None
    parts = 1 if single else job.parts
    if not parts or len(job.placements) < parts:
        return  # a part not seen placed yet
    if all(_RANK[p.state] >= _RANK[_S.JOB_STATE_RUNNING] for p in job.placements):
        advance(job, _S.JOB_STATE_RUNNING)
    if any(p.state not in ended for p in job.placements):
        return
    failed = [p for p in job.placements if p.state == _S.JOB_STATE_FAILED]
    # A part that failed on its own says why, before the parts stopped for it; of
    # several, the first to end (min keeps rank order on ties).
    failed = [p for p in failed if not p.stop_requested] or failed
    says = min(failed, key=lambda p: _time(p.finished_at)) if failed else job.placements[0]
    advance(job, says.state)
    job.exit_code = says.exit_code
    # Why a preempted (or lost) job ended is that, not the signal that carried it out.
    if job.state == _S.JOB_STATE_FAILED:
        gang_failed = job.stop_cause == types_pb2.STOP_CAUSE_GANG_FAILED
        job.reason = job.stop_reason if gang_failed else says.reason  # it names the rank
    job.finished_at.CopyFrom(max((p.finished_at for p in job.placements), key=_time))
    _end_if_stopped(job)


def _protect(job: types_pb2.Job, placed: events_pb2.TaskPlaced | None = None) -> None:
    """Keep how the latest placement is protected (every task of a gang says the same),
    and until when once it started (its placement and start arrive in either order)."""
    if placed is not None:
        job.protection = placed.protection
        if placed.HasField("protected_for"):
            job.protected_for.CopyFrom(placed.protected_for)
    if job.HasField("protected_for") and job.HasField("started_at"):
        until = job.started_at.ToNanoseconds() + job.protected_for.ToNanoseconds()
        job.protected_until.FromNanoseconds(until)


def advance(job: types_pb2.Job, state: State) -> None:
    """Raise the state to ``state`` unless the job is already there or beyond."""
    if _RANK[state] <= _RANK[job.state]:
        return
    if _RANK[job.state] <= _RANK[_S.JOB_STATE_PENDING]:
        job.reason = job.wait_code = ""  # a reason to wait lapses once it leaves the queue
    if _RANK[state] > _RANK[_S.JOB_STATE_RUNNING]:
        job.idle = False  # only a running task holds GPUs that can sit idle
    job.state = state


def note_stop(job: types_pb2.Job, stop: events_pb2.TaskStopRequested) -> None:
    """Keep why the latest placement is stopped. Placement stops a placement for one
    cause; were two seen, one that ends the job outranks one that does not, and of two
    that do, the one ending it in the higher state wins, so that any order agrees."""
    if _stop_rank(stop.cause) >= _stop_rank(job.stop_cause):
        job.stop_reason = stop.reason
        job.stop_cause = stop.cause


def _stop_rank(cause: types_pb2.StopCause.ValueType) -> int:
    return _RANK[_STOP_ENDS.get(cause, _S.JOB_STATE_UNSPECIFIED)]


def _end_if_stopped(job: types_pb2.Job) -> None:
    """The tasks ended: a stop that ends the job for good says how. Checked on both the
    stop and the tasks' ends: whichever arrives last decides."""
    state = _STOP_ENDS.get(job.stop_cause)
    if state is None:
        return
    advance(job, state)
    if job.state == _S.JOB_STATE_TIMEOUT:
        job.reason = job.stop_reason  # the time limit, not the signal that carried it out


def _fill_node(job: types_pb2.Job, node_id: str) -> None:
    if not job.node_id:
        job.node_id = node_id


# -- workflow jobs -------------------------------------------------------------


def workflow_names(spec: types_pb2.JobSpec) -> tuple[str, ...] | None:
    """The task names of the job's workflow in workflow order; None when the scheduler
    does not run the job as a workflow (no workflow, or one that breaks a DAG rule)."""
    if not spec.HasField("workflow"):
        return None
    workflow = workflow_from_proto(spec.workflow)
    return None if workflow is None else tuple(t.task_id for t in workflow.tasks)


def is_workflow_task(job: types_pb2.Job, task_id: str) -> bool:
    """Whether a task of this job is a workflow task; see the module's notes for a job
    whose spec is not known yet."""
    if job.HasField("spec"):
        return workflow_names(job.spec) is not None
    return bool(job.tasks) or not is_batch_task_id(job.job_id, task_id)


def advance_task(task: types_pb2.JobTask | types_pb2.JobPlacement, state: State) -> bool:
    """Raise a task's state; whether it is now ``state`` (False: it was already beyond)."""
    if _RANK[state] > _RANK[task.state]:
        task.state = state
    return task.state == state


def fill_task_node(task: types_pb2.JobTask, node_id: str) -> None:
    if not task.node_id:
        task.node_id = node_id


def settle_workflow(job: types_pb2.Job, names: tuple[str, ...]) -> None:
    """Derive the job's state and times from its tasks (``names``: its workflow's)."""
    tasks = list(job.tasks)
    failed = [t for t in tasks if t.state == _S.JOB_STATE_FAILED]
    finished = [t for t in tasks if t.state == _S.JOB_STATE_FINISHED]
    derived: State | None = None
    if failed:
        derived = _S.JOB_STATE_FAILED
    elif names and {t.name for t in finished} >= set(names):
        derived = _S.JOB_STATE_FINISHED
    elif finished or any(t.state == _S.JOB_STATE_RUNNING for t in tasks):
        derived = _S.JOB_STATE_RUNNING
    elif any(t.state == _S.JOB_STATE_PLACED for t in tasks):
        derived = _S.JOB_STATE_PLACED
    if derived is not None:
        advance(job, derived)
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
    if derived in (_S.JOB_STATE_FINISHED, _S.JOB_STATE_FAILED):
        _end_if_stopped(job)


def _time(ts: Timestamp) -> tuple[int, int]:
    return (ts.seconds, ts.nanos)
