"""Who may see which job, and finding it: admission's access rule."""

from __future__ import annotations

import grpc
from qm.v1 import types_pb2

from libs.core.ids import is_array_id
from libs.core.limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_NAME_CHARS,
)
from libs.readmodels import JobFilter, Scope, scope_of
from services.admission.budget_view import BudgetView
from services.admission.journal import Journal
from services.admission.requests import RequestLog
from services.projector.client import ProjectorClient
from services.status import bounded


class Access:
    """Who sees which job: every job for operators and the root's managers, else the
    jobs of the allocations the user belongs to (``libs.readmodels.scope_of``), looked
    up in the projector's view and in what this instance recorded lately."""

    def __init__(
        self,
        *,
        projector: ProjectorClient,
        budget: BudgetView,
        requests: RequestLog,
        journal: Journal,
        operators: frozenset[str] = frozenset(),
    ) -> None:
        self._projector = projector
        self._budget = budget
        self._requests = requests
        self._journal = journal
        self._operators = operators

    async def job_or_abort(self, job_id: str, context: grpc.aio.ServicerContext) -> types_pb2.Job:
        await bounded(context, "job_id", job_id, MAX_NAME_CHARS)
        job = await self.lookup(job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, no_job(job_id))
        assert job is not None
        return job

    async def visible_job_or_abort(
        self, user: str, job_id: str, context: grpc.aio.ServicerContext
    ) -> types_pb2.Job:
        """The job, if ``user`` may see it; a job they may not see is answered as one that
        does not exist, so that its existence is not told either."""
        job = await self.job_or_abort(job_id, context)
        if not await self.may_see(user, job):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r}")
        return job

    async def may_see(self, user: str, job: types_pb2.Job) -> bool:
        scope = await self.scope(user)
        return scope is None or scope.admits(job)

    async def is_operator(self, user: str) -> bool:
        """Whether ``user`` sees every job and may steer the cluster's nodes."""
        return await self.scope(user) is None

    async def scope(self, user: str) -> Scope | None:
        """The jobs ``user`` may see; None: every job (operators, the root's managers)."""
        return scope_of(user, await self._budget.tree(), self._operators)

    async def lookup(self, job_id: str) -> types_pb2.Job | None:
        return await self._projector.get_job(job_id) or self._journal.recent(job_id)

    async def seen_by(self, user: str, job_id: str) -> types_pb2.Job | None:
        """The job if ``user`` may see it: as ``_lookup`` finds it, else as the log's claim
        has it (one submitted a moment ago through another instance may not be projected)."""
        job = await self.lookup(job_id)
        if job is None and (claim := self._requests.claim(job_id)) is not None:
            job = types_pb2.Job(job_id=job_id, spec=claim.spec)
        return job if job is not None and await self.may_see(user, job) else None

    async def elements(self, user: str, array_id: str) -> list[types_pb2.Job]:
        """The elements of a job array that ``user`` may see, by index: as projected, and
        those this instance recorded that are not yet (read-your-writes)."""
        where = JobFilter(array_id=array_id)
        scope = await self.scope(user)
        found = {
            job.job_id: job
            for job in await self._projector.list_jobs(where, MAX_ARRAY_ELEMENTS, scope)
        }
        for job in self._journal.recent_jobs():
            seen = scope is None or scope.admits(job)
            if job.job_id not in found and where.matches(job) and seen:
                found[job.job_id] = job
        return sorted(found.values(), key=lambda job: job.spec.array.index)

    async def known(self, job_id: str) -> bool:
        return await self.lookup(job_id) is not None


def no_job(job_id: str) -> str:
    """What a job id that names no job the caller may see gets; an array's id says how
    to ask for its elements instead."""
    if is_array_id(job_id):
        return (
            f"{job_id} is a job array, not one job: qm status {job_id} lists its elements, "
            f"and {job_id}_N names element N"
        )
    return f"no job {job_id!r}"
