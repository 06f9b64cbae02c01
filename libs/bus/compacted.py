"""A compacted topic as a key-value store of large records: what services keep their
snapshots in.

Compaction keeps each key's latest record; until it runs, older ones are there too, so
reading the topic end to end and keeping the last value of each key finds the latest
whatever has been compacted. Records are written whole and read whole (up to 64 MiB,
the snapshot topics' ``max_message_bytes``).
"""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from libs.bus.ports import Bus, Producer
from libs.bus.topics import TopicSpec
from libs.telemetry import replaying

LARGE = 64 << 20


class CompactedTopic:
    def __init__(self, bus: Bus, topic: TopicSpec, *, client_id: str) -> None:
        self._bus = bus
        self._topic = topic.name
        self._partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        self._client_id = client_id
        self._producer: Producer | None = None  # made at the first put: many never write

    async def put(self, key: bytes, value: bytes) -> None:
        """Write ``value`` as ``key``'s latest (acknowledged before returning)."""
        if self._producer is None:
            self._producer = self._bus.producer(client_id=self._client_id, max_request_size=LARGE)
            await self._producer.start()
        await (await self._producer.send(self._topic, value=value, key=key))

    async def latest(self) -> dict[bytes, bytes]:
        """Each key's latest value, as the topic stands now."""
        found: dict[bytes, bytes] = {}
        reader = self._bus.consumer(
            client_id=self._client_id, max_partition_fetch_bytes=LARGE, fetch_max_bytes=LARGE
        )
        await reader.start()
        try:
            reader.assign(self._partitions)
            ends = await reader.end_offsets(self._partitions)
            for tp in self._partitions:
                await reader.seek_to_beginning(tp)
                while await reader.position(tp) < ends[tp]:
                    with replaying():
                        polled = await reader.getmany(tp, timeout_ms=1000)
                    for record in polled.get(tp, []):
                        if record.key is not None and record.value is not None:
                            found[record.key] = record.value
        finally:
            await reader.stop()
        return found

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
