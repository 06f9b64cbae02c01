"""How batch work stops and ends: a stop asked of its tasks, a task's end, a job's end
(charged no more, requeued or over), and the jobs waiting for one that ended judged
again. The fold (an input that stops or ends work) and the cycle (preemption) both
end work here, so a job ends one way whoever stopped it.
"""

from __future__ import annotations

from libs.core.decisions import (
    WARNED,
    Cancel,
    Decision,
    JobLost,
    Preempted,
    Preemption,
    Requeue,
    Stop,
    StopCause,
    Wait,
    requeues,
)
from libs.core.dependencies import Outcome, waiting_reason
from libs.core.facts import Facts
from libs.core.ids import JobId, NodeId, TaskId, gang_rank
from libs.core.queues import Waiting
from libs.core.running import Running


def stop(
    facts: Facts,
    run: Running,
    cause: StopCause,
    reason: str,
    preemption: Preemption | None = None,
) -> list[Decision]:
    """Ask every task of ``run`` still running to stop, warned first when its cause is
    one that warns (``WARNED``); free work stopped for others gets its grace."""
    config = facts.config
    facts.running.update(run.job_id, stopping=cause, stop_reason=reason)
    preempted_free = cause is StopCause.PREEMPTED and not run.spec.allocated
    grace_s = config.free_stop_grace_s if preempted_free else 0.0
    warn_s = run.warning_s(config) if cause in WARNED else 0.0
    warn_signal = run.spec.warning_signal if warn_s else ""
    return [
        Stop(
            run.job_id,
            task_id,
            node_id,
            cause,
            reason,
            grace_s,
            preemption,
            warn_signal,
            warn_s,
        )
        for task_id, (node_id, _) in sorted(run.tasks.items())
        if task_id not in run.ended
    ]


def preempt(facts: Facts, victim: JobId, for_job: str, allocation: str) -> list[Decision]:
    """Stop ``victim`` for ``for_job`` (empty: for workflow serving) of ``allocation``,
    saying by which rule (its requeue or end repeats it)."""
    run = facts.running.jobs[victim]
    preemption = Preemption(for_job, allocation, run.preemption_rule(facts.config, facts.now))
    return stop(facts, run, StopCause.PREEMPTED, str(preemption), preemption)


def task_ended(
    facts: Facts,
    job_id: JobId,
    task_id: TaskId,
    node_id: NodeId,
    at: float,
    exit_code: int = 0,
) -> list[Decision]:
    """A task ended; a report from another node than the task's is not believed. A
    part that exits non-zero while the job runs stops the rest of its gang. The GPUs of
    a job stopped for a backed-up serving pool go to the pool."""
    run = facts.running.end(job_id, task_id, node_id)
    if run is None:
        return []
    facts.capacity.give(node_id, run.tasks[task_id][1])
    stopped: list[Decision] = []
    if exit_code != 0 and run.stopping is None and not run.failed:
        rank = gang_rank(task_id)
        part = "exited" if rank is None else f"rank {rank} exited"
        run = run.but(failed=f"{part} with code {exit_code}")
        facts.running.update(job_id, failed=run.failed)  # a no-op once it is over
        if len(run.ended) < len(run.tasks):
            why = f"{run.failed}: its gang lives and dies as one"
            stopped = stop(facts, run, StopCause.GANG_FAILED, why)
    reclaim = facts.reclaiming.value
    adopted: list[Decision] = []
    if reclaim is not None and job_id == reclaim.job_id:  # its GPUs are serving's
        keys = [(node_id, i) for i in run.tasks[task_id][1]]
        adopted = facts.serving.adopt(keys, reclaim.allocation, facts.now_ms)
    if len(run.ended) < len(run.tasks):  # the rest of its gang still runs
        return stopped + adopted
    if reclaim is not None and job_id == reclaim.job_id:
        facts.reclaiming.value = None  # requeued, it may run again: no longer a victim
    return adopted + _job_ended(facts, run, at)


def _job_ended(facts: Facts, run: Running, at: float) -> list[Decision]:
    """A job's last task ended: it is no longer charged; one that was stopped is
    requeued, or ends. The jobs waiting for one that ended hear how."""
    facts.charges.count(run, -1)
    if run.stopping is None and run.started_at is not None:  # it ran to its end
        facts.learned.completed(run.spec.user, at - run.started_at)
    if run.stopping is StopCause.PREEMPTED:
        what = run.stop_reason or "preempted"
    elif run.stopping is StopCause.NODE_LOST:
        what = run.lost
    elif run.stopping is StopCause.DRAINED:
        what = "its node was drained"
    else:
        return over(facts, run.job_id, _outcome(run))
    if requeues(run.stopping, run.spec.resumable):
        how = "resumable" if run.spec.resumable else "it starts over: not resumable"
        facts.queues.push(Waiting(run.job_id, run.spec, run.seq, run.attempt + 1, at))
        return [Requeue(run.job_id, f"{what}; requeued ({how})")]
    if run.stopping is StopCause.PREEMPTED:
        ended: Decision = Preempted(run.job_id, f"{what}; not resumable")
        outcome = Outcome(False, "was preempted")
    else:
        ended = JobLost(run.job_id, f"{what}; not resumable")
        outcome = Outcome(False, "was lost with its node")
    return [ended, *over(facts, run.job_id, outcome)]


def judge(facts: Facts, job: Waiting) -> list[Decision]:
    """Judge a blocked job's dependencies again: it joins the queues, is cancelled,
    or hears which it waits for now."""
    verdict = facts.dependencies.judge(job)
    if verdict.waits_for is not None:
        reason = waiting_reason(verdict.waits_for)
        if facts.reasons.get(job.job_id) == reason:
            return []
        facts.reasons[job.job_id] = reason
        return [Wait(job.job_id, reason)]
    facts.dependencies.unblock(job.job_id)
    facts.reasons.pop(job.job_id, None)
    if verdict.ready:
        facts.queues.push(job)
        return []
    cancelled = Cancel(job.job_id, f"cancelled: {verdict.broken}")
    return [cancelled, *over(facts, job.job_id, Outcome(False, "was cancelled"))]


def over(facts: Facts, job_id: JobId, outcome: Outcome) -> list[Decision]:
    """``job_id`` ended for good: the jobs waiting for it are judged again (a
    cancelled one's own dependents in turn, through ``judge``)."""
    return [
        decision
        for waiting in facts.dependencies.ended(job_id, outcome)
        for decision in judge(facts, waiting)
    ]


def _outcome(run: Running) -> Outcome:
    """How a job that ran ended, as the jobs waiting for it judge it."""
    match run.stopping:
        case None if run.failed:
            return Outcome(False, f"failed ({run.failed})")
        case None:
            return Outcome(True, "finished")
        case StopCause.TIME_LIMIT:
            return Outcome(False, "timed out")
        case StopCause.GANG_FAILED:
            return Outcome(False, f"failed ({run.failed})")
        case _:
            return Outcome(False, "was cancelled")
