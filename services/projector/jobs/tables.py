"""Jobs as records (see ``libs.readmodels.jobs``): heads, specs and workflow tasks,
a table each, written by the jobs agent alone."""

from __future__ import annotations

from qm.v1 import events_pb2, types_pb2

from libs.readmodels import ALL_JOBS, DEFAULT_LIST_LIMIT, JobFilter, JobRecords, Scope
from services.projector.app import TOPICS, protobuf_table

jobs = protobuf_table("jobs", TOPICS.jobs_view)
job_specs = protobuf_table("job_specs", TOPICS.job_specs_view)
job_tasks = protobuf_table("job_tasks", TOPICS.job_tasks_view)
records = JobRecords(jobs, job_specs, job_tasks)


def fold_job_event(env: events_pb2.Envelope) -> None:
    """Fold an envelope into the tables; only from the jobs agent (a table is
    written by one agent)."""
    records.apply(env)


def get_job(job_id: str) -> types_pb2.Job | None:
    return records.job(job_id)


def list_jobs(
    where: JobFilter = ALL_JOBS, limit: int = DEFAULT_LIST_LIMIT, scope: Scope | None = None
) -> list[types_pb2.Job]:
    return records.jobs(where=where, limit=limit, scope=scope)
