"""Keeps the ``jobs`` table: decode, fold with ``libs.readmodels``, store."""

from __future__ import annotations

import faust

from libs.readmodels import apply_job_event, job_key
from services.projector.app import app
from services.projector.inputs import envelopes, log_topics
from services.projector.jobs.tables import get_job, put_job


@app.agent(log_topics)
async def project_jobs(stream: faust.StreamT[bytes]) -> None:
    async for env in envelopes(stream, consumer="jobs"):
        job_id = job_key(env)
        if job_id is None:
            continue
        job = apply_job_event(get_job(job_id), env)
        if job is not None:
            put_job(job)
