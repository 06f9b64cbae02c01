"""Append a ``ClockTick`` per cluster at a steady pace; the one place that reads the clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from aiokafka.errors import KafkaError
from qm.v1 import events_pb2

from libs.events import new_envelope

log = logging.getLogger(__name__)

PRODUCER = "ticker"


class Sender(Protocol):
    """What the ticker needs of ``libs.bus.EventProducer``."""

    async def send(
        self, topic: str, env: events_pb2.Envelope, *, key: str | None = None
    ) -> None: ...


async def tick(sender: Sender, topic: str, clusters: Sequence[str]) -> None:
    """One tick for each cluster, stamped now, keyed by cluster like all its input."""
    for cluster in clusters:
        env = new_envelope(events_pb2.ClockTick(), producer=PRODUCER, cluster=cluster)
        await sender.send(topic, env, key=env.cluster)


async def run(sender: Sender, topic: str, clusters: Sequence[str], interval_s: float) -> None:
    """Tick every ``interval_s`` until cancelled.

    The pace is kept against the loop's monotonic clock, so a slow send does not
    make ticks drift; ticks missed while stalled are not made up (one tick says
    the time as well as many). A failed send is logged and the next tick tried.
    """
    loop = asyncio.get_running_loop()
    due = loop.time()
    while True:
        try:
            await tick(sender, topic, clusters)
        except KafkaError as exc:
            log.warning("tick not appended: %s", exc)
        due = max(due + interval_s, loop.time())
        await asyncio.sleep(due - loop.time())
