"""A placement service that stops, once, in the middle of a batch: to move its
partitions away (a rebalance) while it decides, over the memory bus or the broker."""

from __future__ import annotations

import asyncio
from typing import Any

from qm.v1 import events_pb2

from libs.bus import Delivery, EventProducer
from services.placement.service import PlacementService


class GatedPlacement(PlacementService):
    """Pauses before deciding the admission of ``pause_at`` (``after_fold``: once its
    scheduler has folded it, while its decisions are queued), until ``go_on`` is set."""

    def __init__(self, *args: Any, pause_at: str, after_fold: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause_at = pause_at
        self.after_fold = after_fold
        self.paused = asyncio.Event()
        self.go_on = asyncio.Event()

    async def _gate(self) -> None:
        if not self.go_on.is_set():
            self.paused.set()
            await self.go_on.wait()

    async def _decide(
        self, producer: EventProducer, delivery: Delivery
    ) -> tuple[list[events_pb2.Envelope], list[Any]]:
        if delivery.envelope.job_admitted.job_id == self.pause_at and not self.after_fold:
            await self._gate()
        return await super()._decide(producer, delivery)

    async def _enqueue(
        self, producer: EventProducer, outputs: list[events_pb2.Envelope]
    ) -> list[Any]:
        if self.after_fold and any(out.correlation_id == self.pause_at for out in outputs):
            await self._gate()
        return await super()._enqueue(producer, outputs)
