"""Estimated starts for the waiting queue, from admission: placement's core knows when a
blocked job with the nodes that free soonest earmarked for it will likely start
(``qm why``); it knows no start for the other waiting jobs, which the page shows as "—".

Asked with the signed-in user's own token, so admission applies that user's access
rules; an answer is kept for a few seconds, as the page refreshes every few.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.readmodels.dashboard import Json
from libs.readmodels.occupancy import moment
from services.grpc_server import bearer
from services.tls import TlsSettings, aio_channel

ASKED_AT_MOST = 20  # waiting jobs a view asks about, in queue order
KEEP_S = 5.0


class StartEstimates:
    def __init__(
        self, target: str, tls: TlsSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._channel = aio_channel(target, tls)
        self._jobs = js_grpc.JobServiceStub(self._channel)
        self._clock = clock
        self._known: dict[str, tuple[float, float | None]] = {}  # job -> (asked at, start)

    async def fill(self, view: Json, token: str) -> None:
        """Set ``estimated_start`` (seconds since the epoch, or None) on the view's first
        waiting jobs; a job admission does not answer for keeps None."""
        waiting = view.get("waiting", [])[:ASKED_AT_MOST]
        starts = await asyncio.gather(*(self._start(job["job_id"], token) for job in waiting))
        for job, start in zip(waiting, starts, strict=True):
            job["estimated_start"] = start

    async def close(self) -> None:
        await self._channel.close()

    async def _start(self, job_id: str, token: str) -> float | None:
        now = self._clock()
        known = self._known.get(job_id)
        if known is not None and now - known[0] < KEEP_S:
            return known[1]
        try:
            answer = await self._jobs.ExplainJob(
                js.ExplainJobRequest(job_id=job_id), metadata=bearer(token), timeout=2
            )
        except grpc.aio.AioRpcError:
            return None  # admission away, or the job gone: no estimate, nothing more
        start = moment(answer.estimated_start)
        self._known = {j: k for j, k in self._known.items() if now - k[0] < KEEP_S}
        self._known[job_id] = (now, start)
        return start
