"""Reading jobs: one, a list, one as it changes, its output, why it waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from libs.auth import Keys
from libs.core.ids import is_array_id
from libs.core.limits import (
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
)
from libs.events.convert import preemption_from_proto
from libs.readmodels import DEFAULT_LIST_LIMIT, JobFilter, has_ended
from services.admission.explainer import Explainer
from services.admission.scope import Access, no_job
from services.admission.tasklogs import NoOutput, TaskLogReader, job_output
from services.authn import caller
from services.projector.client import ProjectorClient
from services.status import bounded

# The states a list may ask for: every one a job can be in.
_LISTED_STATES = frozenset(types_pb2.JobState.values()) - {types_pb2.JOB_STATE_UNSPECIFIED}


class Queries:
    """``GetJob``, ``ListJobs``, ``WatchJob``, ``StreamLogs``, ``ExplainJob``: what a user
    may see of the jobs they may see."""

    def __init__(
        self,
        *,
        access: Access,
        projector: ProjectorClient,
        keys: Keys,
        explainer: Explainer,
        logs: TaskLogReader,
        watch_interval_s: float = 0.2,
    ) -> None:
        self._access = access
        self._projector = projector
        self._keys = keys
        self._explainer = explainer
        self._logs = logs
        self._watch_interval_s = watch_interval_s

    async def GetJob(
        self, request: js.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> js.GetJobResponse:
        user = await caller(context, self._keys)
        return js.GetJobResponse(
            job=await self._access.visible_job_or_abort(user, request.job_id, context)
        )

    async def ListJobs(
        self, request: js.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> js.ListJobsResponse:
        user = await caller(context, self._keys)
        await bounded(context, "allocation", request.allocation, MAX_TEXT_CHARS)
        await bounded(context, "user", request.user, MAX_NAME_CHARS)
        states = frozenset(request.states)
        if unknown := states - _LISTED_STATES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"states: {', '.join(str(s) for s in sorted(unknown))} name no job state; use "
                + ", ".join(types_pb2.JobState.Name(s) for s in sorted(_LISTED_STATES)),
            )
        await bounded(context, "array_id", request.array_id, MAX_NAME_CHARS)
        if request.array_id and not is_array_id(request.array_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"array_id: {request.array_id!r} names no job array (a-<hex>, as submitted)",
            )
        # The filter picks within the caller's scope: the projector applies both.
        where = JobFilter(request.allocation, request.user, states, request.array_id)
        scope = await self._access.scope(user)
        jobs = await self._projector.list_jobs(where, request.limit or DEFAULT_LIST_LIMIT, scope)
        return js.ListJobsResponse(jobs=jobs)

    async def WatchJob(
        self, request: js.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.WatchJobResponse]:
        user = await caller(context, self._keys)
        await bounded(context, "job_id", request.job_id, MAX_NAME_CHARS)
        last: types_pb2.Job | None = None
        while True:
            job = await self._access.lookup(request.job_id)
            if last is None and (job is None or not await self._access.may_see(user, job)):
                await context.abort(grpc.StatusCode.NOT_FOUND, no_job(request.job_id))
            if job is not None and job != last:
                yield js.WatchJobResponse(job=job)
                last = job
                if has_ended(job):
                    return
            await asyncio.sleep(self._watch_interval_s)

    async def StreamLogs(
        self, request: js.StreamLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.StreamLogsResponse]:
        user = await caller(context, self._keys)
        job = await self._access.visible_job_or_abort(user, request.job_id, context)
        while request.follow and not _has_output_to_follow(job):
            await asyncio.sleep(self._watch_interval_s)
            job = await self._access.lookup(job.job_id) or job
        pieces = job_output(
            self._logs,
            job,
            nodes=lambda job: self._projector.list_nodes(job.spec.cluster),
            lookup=self._access.lookup,
            attempt=request.attempt,
            follow=request.follow,
        )
        try:
            async for task, data in pieces:
                yield js.StreamLogsResponse(
                    data=data,
                    source=task.endpoint,
                    task_id=task.task_id,
                    node_id=task.node_id,
                    attempt=task.attempt,
                    part=task.part,
                )
        except NoOutput as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def ExplainJob(
        self, request: js.ExplainJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ExplainJobResponse:
        user = await caller(context, self._keys)
        job = await self._access.visible_job_or_abort(user, request.job_id, context)
        answer = js.ExplainJobResponse(
            job_id=job.job_id, state=job.state, allocation=job.spec.allocation
        )
        why = self._explainer.explain(job.job_id, job.spec.cluster or "default")
        if why is None or has_ended(job):
            answer.reason = _explain(job)
            return answer
        answer.reason = why.text
        last = preemption_from_proto(job.preemption) if job.HasField("preemption") else None
        if last is not None:  # it waits again, or runs again: say what stopped it before
            answer.reason += f"; earlier {last}"
        answer.jobs_ahead = why.jobs_ahead
        if why.starts_at is not None:
            answer.estimated_start.FromNanoseconds(int(why.starts_at * 1e9))
        if why.standing is not None:
            answer.rank = why.standing.rank
            answer.ranks = why.standing.of
            answer.fair_share_ratio = why.standing.ratio
        return answer


def _has_output_to_follow(job: types_pb2.Job) -> bool:
    """Whether following the job's output can start: its task runs (so its agent knows
    it is still writing) or it is over."""
    return (
        job.state == types_pb2.JOB_STATE_RUNNING
        or has_ended(job)
        or any(task.state == types_pb2.JOB_STATE_RUNNING for task in job.tasks)
    )


def _explain(job: types_pb2.Job) -> str:
    state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
    if job.state == types_pb2.JOB_STATE_PENDING:
        return job.reason or "waiting for the scheduler to consider it"
    if job.spec.HasField("workflow") and job.tasks:
        done = sum(t.state == types_pb2.JOB_STATE_FINISHED for t in job.tasks)
        progress = f"{done} of {len(job.spec.workflow.tasks)} workflow tasks finished"
        if job.state in (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING):
            return f"{state}: {progress}"
    if job.state in (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING):
        gpus = ",".join(str(g) for g in job.gpu_indices)
        return f"{state} on {job.node_id} (GPUs {gpus})"
    if job.reason.startswith(state):  # "preempted for ...": it says so itself
        return job.reason
    return f"{state}" + (f": {job.reason}" if job.reason else "")
