"""Admission's one reader of the events topic: it feeds every view that folds the log
(the explainer's schedulers, the request log) and says how far it has read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2

from libs.bus import Bus, LogReader
from services.runtime import cancel_and_wait

# A view folds each record: decoded, and its bytes (what a signature covers).
View = Callable[[events_pb2.Envelope, bytes], None]


class Follower:
    def __init__(self, bus: Bus, topic: str, views: Sequence[View]) -> None:
        self._reader = LogReader(bus, topic, name="admission-follower")
        self._views = tuple(views)
        self._follow: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read the whole topic, then follow it in the background."""
        await self._reader.start()
        await self._reader.catch_up_records(self._apply)
        self._follow = asyncio.create_task(self._reader.follow_records(self._apply))

    async def stop(self) -> None:
        if self._follow is not None:
            await cancel_and_wait(self._follow)
        await self._reader.stop()

    async def reached(self, tp: TopicPartition, offset: int) -> None:
        """Return once every view has folded the record at ``offset`` of ``tp``."""
        await self._reader.reached(tp, offset)

    def _apply(self, env: events_pb2.Envelope, record: bytes) -> None:
        for view in self._views:
            view(env, record)
