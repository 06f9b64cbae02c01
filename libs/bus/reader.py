"""Read a whole topic from the start, then follow it: how services rebuild state.

No consumer group: every reader sees every partition. Undecodable records are
skipped here; the group consumers of the same topic dead-letter them.
"""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2

from libs.bus.settings import KafkaSettings
from libs.events import DecodeError, decode

Apply = Callable[[events_pb2.Envelope], None]


class LogReader:
    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self._topic = topic
        self._consumer = AIOKafkaConsumer(
            **settings.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
        )
        self._partitions: list[TopicPartition] = []

    async def start(self) -> None:
        await self._consumer.start()
        partitions = self._consumer.partitions_for_topic(self._topic)
        if not partitions:
            await self._consumer.stop()
            raise RuntimeError(f"topic {self._topic} does not exist; run `python -m libs.bus`")
        self._partitions = [TopicPartition(self._topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def catch_up(self, apply: Apply) -> int:
        """Apply every record up to the current end of the topic; return how many."""
        ends = await self._consumer.end_offsets(self._partitions)
        count = 0
        while any(await self._consumer.position(tp) < ends[tp] for tp in self._partitions):
            count += await self._poll(apply)
        return count

    async def follow(self, apply: Apply) -> None:
        while True:
            await self._poll(apply)

    async def _poll(self, apply: Apply) -> int:
        polled = await self._consumer.getmany(timeout_ms=500, max_records=10_000)
        count = 0
        for records in polled.values():
            for record in records:
                try:
                    env = decode(record.value)
                except DecodeError:
                    continue
                apply(env)
                count += 1
        return count
