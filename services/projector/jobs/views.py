"""``GET /jobs/{job_id}`` -> ``qm.v1.Job``; ``GET /jobs?allocation=&limit=`` -> ListJobsResponse."""

from __future__ import annotations

from faust import web
from qm.v1 import job_service_pb2

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
        jobs = list_jobs(allocation=request.query.get("allocation", ""), limit=limit)
        reply = job_service_pb2.ListJobsResponse(jobs=jobs)
        return self.bytes(reply.SerializeToString(deterministic=True), content_type=PROTOBUF)
