"""Steering a job: cancel, hold, release, update."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js

from libs.auth import Keys
from libs.core.budget_tree import BudgetTree
from libs.core.ids import is_array_id
from libs.readmodels import has_ended
from services.admission.budget_view import BudgetView
from services.admission.claims import Submissions, rejection_text
from services.admission.journal import Journal
from services.admission.scope import Access
from services.authn import caller


class Steering:
    """``CancelJob``, ``HoldJob``, ``ReleaseJob``, ``UpdateJob``: a job's own user, or a
    manager of its allocation, steers it (a job array: every element they may)."""

    def __init__(
        self,
        *,
        journal: Journal,
        access: Access,
        submissions: Submissions,
        budget: BudgetView,
        keys: Keys,
    ) -> None:
        self._journal = journal
        self._access = access
        self._submissions = submissions
        self._budget = budget
        self._keys = keys

    async def CancelJob(
        self, request: js.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> js.CancelJobResponse:
        if is_array_id(request.job_id):
            cancelled = await self._steer_array(
                request.job_id,
                "cancel",
                context,
                takes=lambda job: not has_ended(job),
                event=lambda job, user: events_pb2.JobCancelRequested(
                    job_id=job.job_id, requested_by=user
                ),
                none_left="is still to end: all have ended",
            )
            return js.CancelJobResponse(job_id=request.job_id, cancelled=cancelled)
        user, job = await self._steerable_job_or_abort(request.job_id, "cancel", context)
        if has_ended(job):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.job_id} already ended ({types_pb2.JobState.Name(job.state)})",
            )
        await self._journal.record(
            [events_pb2.JobCancelRequested(job_id=job.job_id, requested_by=user)],
            job.job_id,
            job.spec.cluster or "default",
        )
        return js.CancelJobResponse(job_id=job.job_id)

    async def _steer_array(
        self,
        array_id: str,
        verb: str,
        context: grpc.aio.ServicerContext,
        *,
        takes: Callable[[types_pb2.Job], bool],
        event: Callable[[types_pb2.Job, str], Message],
        none_left: str,
    ) -> list[str]:
        """Act on every element of the array that the caller may steer and that
        ``takes`` (an ``event`` each, as if one by one); the elements acted on. Refused
        (nothing recorded) when the caller sees none, may steer none, or none takes it
        (``none_left`` says why)."""
        user = await caller(context, self._keys)
        elements = await self._access.elements(user, array_id)
        if not elements:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job array {array_id!r}")
        tree = await self._budget.tree()
        mine = [job for job in elements if _may_steer(user, job, tree)]
        if not mine:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _steer_rule(user, verb))
        chosen = [job for job in mine if takes(job)]
        if not chosen:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no element of job array {array_id} that you may {verb} {none_left}",
            )
        by_cluster: dict[str, list[Message]] = {}
        for job in chosen:
            by_cluster.setdefault(job.spec.cluster or "default", []).append(event(job, user))
        for cluster, events in by_cluster.items():
            await self._journal.record(events, array_id, cluster)
        return [job.job_id for job in chosen]

    async def HoldJob(
        self, request: js.HoldJobRequest, context: grpc.aio.ServicerContext
    ) -> js.HoldJobResponse:
        if is_array_id(request.job_id):
            held = await self._steer_array(
                request.job_id,
                "hold",
                context,
                takes=lambda job: _waits(job) and not job.held,
                event=lambda job, user: events_pb2.JobHeld(
                    job_id=job.job_id, held=True, requested_by=user
                ),
                none_left="is waiting and not held",
            )
            return js.HoldJobResponse(job_id=request.job_id, held=held)
        user, job = await self._steerable_job_or_abort(request.job_id, "hold", context)
        await _waiting_batch_job_or_abort(job, "held", context)
        await self._record_hold(job, user, held=True)
        return js.HoldJobResponse(job_id=job.job_id)

    async def ReleaseJob(
        self, request: js.ReleaseJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ReleaseJobResponse:
        if is_array_id(request.job_id):
            released = await self._steer_array(
                request.job_id,
                "release",
                context,
                takes=lambda job: job.held and not has_ended(job),
                event=lambda job, user: events_pb2.JobHeld(
                    job_id=job.job_id, held=False, requested_by=user
                ),
                none_left="is held",
            )
            return js.ReleaseJobResponse(job_id=request.job_id, released=released)
        user, job = await self._steerable_job_or_abort(request.job_id, "release", context)
        if not job.held:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {job.job_id} is not held"
            )
        await self._record_hold(job, user, held=False)
        return js.ReleaseJobResponse(job_id=job.job_id)

    async def UpdateJob(
        self, request: js.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> js.UpdateJobResponse:
        user, job = await self._steerable_job_or_abort(request.job_id, "update", context)
        paths = list(request.update_mask.paths)
        if not paths or not set(paths) <= UPDATABLE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"update_mask: name one or more of {', '.join(sorted(UPDATABLE))}",
            )
        await _waiting_batch_job_or_abort(job, "updated", context)
        spec = types_pb2.JobSpec()
        spec.CopyFrom(job.spec)
        request.update_mask.MergeMessage(request.spec, spec)
        refusal = await self._submissions.refusal(spec, await self._budget.tree())
        if refusal is not None:
            code, _, message = refusal
            await context.abort(code, rejection_text(code, message))
        event = events_pb2.JobUpdated(job_id=job.job_id, spec=spec, requested_by=user)
        await self._journal.record([event], job.job_id, spec.cluster or "default")
        updated = types_pb2.Job()
        updated.CopyFrom(job)
        updated.spec.CopyFrom(spec)
        return js.UpdateJobResponse(job=updated)

    async def _record_hold(self, job: types_pb2.Job, user: str, *, held: bool) -> None:
        event = events_pb2.JobHeld(job_id=job.job_id, held=held, requested_by=user)
        await self._journal.record([event], job.job_id, job.spec.cluster or "default")

    async def _steerable_job_or_abort(
        self, job_id: str, verb: str, context: grpc.aio.ServicerContext
    ) -> tuple[str, types_pb2.Job]:
        """The caller and the job, if they may steer it: their own, or one of an
        allocation they manage."""
        user = await caller(context, self._keys)
        job = await self._access.visible_job_or_abort(user, job_id, context)
        if not _may_steer(user, job, await self._budget.tree()):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _steer_rule(user, verb))
        return user, job


def _may_steer(user: str, job: types_pb2.Job, tree: BudgetTree) -> bool:
    """Whether ``user`` may cancel, hold, release or update ``job``: their own, or one of
    an allocation they manage."""
    return job.spec.user == user or tree.can_manage(user, job.spec.allocation)


def _steer_rule(user: str, verb: str) -> str:
    return f"{user} may {verb} only their own jobs or jobs of allocations they manage"


# What ``qm update`` may change: how much and what kind of room, who pays, the contract;
# never what runs (its command, environment, secrets) or whose it is.
UPDATABLE = frozenset(
    {"gpus", "gpu_type", "min_gpu_memory_gib", "allocation", "min_runtime", "resumable",
     "priority", "runtime_estimate"}
)  # fmt: skip


def _waits(job: types_pb2.Job) -> bool:
    """Whether the job is a batch job that waits: what may be held or updated."""
    waiting = job.state in (types_pb2.JOB_STATE_SUBMITTED, types_pb2.JOB_STATE_PENDING)
    return waiting and not job.spec.HasField("workflow")


async def _waiting_batch_job_or_abort(
    job: types_pb2.Job, done: str, context: grpc.aio.ServicerContext
) -> None:
    """FAILED_PRECONDITION unless the job is a batch job that waits (what can be ``done``)."""
    if not _waits(job):
        state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"only a batch job that waits can be {done}; job {job.job_id} is {state}",
        )
