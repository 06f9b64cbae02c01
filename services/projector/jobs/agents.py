"""Keeps the job tables: decode, check (``services.projector.trust``: refused records
are skipped, the nodes agent parks them), fold with ``libs.readmodels``, store."""

from __future__ import annotations

import faust

from services.projector.app import app
from services.projector.inputs import envelopes, log_topics
from services.projector.jobs.tables import fold_job_event


@app.agent(log_topics)
async def project_jobs(stream: faust.StreamT[bytes]) -> None:
    async for env in envelopes(stream, consumer="jobs"):
        fold_job_event(env)  # an envelope about no job changes nothing
