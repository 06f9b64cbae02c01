"""Job id -> serialized ``qm.v1.Job``."""

from __future__ import annotations

from collections.abc import Iterator

from qm.v1 import types_pb2

from services.projector.app import TOPICS, protobuf_table

jobs = protobuf_table("jobs", TOPICS.jobs_view)


def get_job(job_id: str) -> types_pb2.Job | None:
    data = jobs.get(job_id)
    return None if data is None else types_pb2.Job.FromString(data)


def put_job(job: types_pb2.Job) -> None:
    """Store a job; only from the jobs agent (a table is written by one agent)."""
    jobs[job.job_id] = job.SerializeToString(deterministic=True)


def all_jobs() -> Iterator[types_pb2.Job]:
    return (types_pb2.Job.FromString(data) for data in list(jobs.values()))
