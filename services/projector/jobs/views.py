"""``GET /jobs/{job_id}`` -> ``qm.v1.Job``;
``GET /jobs?allocation=&owner=&state=&array=&limit=`` -> ListJobsResponse.

``allocation``, ``owner`` (who submitted), ``state`` (a ``JobState`` name, repeatable)
and ``array`` (a job array's id: its elements) pick jobs; ``user=`` (and
``allocations=a&allocations=b``) keep the list to what that user may see: their own jobs
and those of the allocations named (admission works them out from the tree)."""

from __future__ import annotations

from typing import cast

from faust import web
from multidict import MultiMapping
from qm.v1 import job_service_pb2, types_pb2

from libs.readmodels import JobFilter, Scope
from services.projector.app import app
from services.projector.contract import PROTOBUF
from services.projector.jobs.tables import get_job, list_jobs


@app.page("/jobs/{job_id}")
class JobView(web.View):
    async def get(self, request: web.Request, job_id: str) -> web.Response:
        job = get_job(job_id)
        if job is None:
            return self.error(404, f"unknown job {job_id!r}")
        return self.bytes(job.SerializeToString(deterministic=True), content_type=PROTOBUF)


@app.page("/jobs")
class JobListView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        raw_limit = request.query.get("limit", "0")
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = -1
        if limit < 0:
            return self.error(400, f"limit must be a non-negative integer, not {raw_limit!r}")
        # faust types the query as a Mapping; aiohttp's MultiDict keeps repeated names.
        query = cast(MultiMapping[str], request.query)
        try:
            states = frozenset(types_pb2.JobState.Value(name) for name in query.getall("state", []))
        except ValueError as exc:
            return self.error(400, str(exc))
        where = JobFilter(
            query.get("allocation", ""), query.get("owner", ""), states, query.get("array", "")
        )
        user = query.get("user", "")
        scope = Scope(user, frozenset(query.getall("allocations", []))) if user else None
        jobs = list_jobs(where, limit=limit, scope=scope)
        reply = job_service_pb2.ListJobsResponse(jobs=jobs)
        return self.bytes(reply.SerializeToString(deterministic=True), content_type=PROTOBUF)
