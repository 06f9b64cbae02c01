"""Answers "why does my job wait?" from a replica of the scheduler.

The replica folds the same input log through the same core as placement
(decisions discarded), so its explanation is the scheduler's own reasoning,
a moment behind at most. No second copy of the policy exists anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib

from qm.v1 import events_pb2

from libs.bus import KafkaSettings, LogReader
from libs.core import PolicyConfig
from libs.core.explain import Explanation
from libs.events.decide import PartitionSchedulers, step


class Explainer:
    def __init__(self, settings: KafkaSettings, topic: str, policy: PolicyConfig) -> None:
        self._reader = LogReader(settings, topic)
        self._schedulers = PartitionSchedulers(policy)
        self._follow: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._reader.start()
        await self._reader.catch_up(self.apply)
        self._follow = asyncio.create_task(self._reader.follow(self.apply))

    async def stop(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow
        await self._reader.stop()

    def apply(self, env: events_pb2.Envelope) -> None:
        step(self._schedulers.of(env.cluster), env)

    def explain(self, job_id: str, cluster: str) -> Explanation | None:
        scheduler = self._schedulers.get(cluster)
        return scheduler.explain(job_id) if scheduler is not None else None
