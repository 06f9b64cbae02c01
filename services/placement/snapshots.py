"""Placement's snapshots on the bus: one compacted record per input partition, the latest.

The topic keeps, per input partition, the last snapshot written (keyed by partition), so
reading it end to end finds every partition's latest state in a few records. Records
that are not snapshots, or that this placement may not load, are passed over with a
warning: a snapshot is only ever a shortcut past folding the log.
"""

from __future__ import annotations

import logging

from aiokafka.structs import TopicPartition
from google.protobuf.message import DecodeError
from qm.v1 import snapshot_pb2

from libs.bus import Bus, TopicSpec
from libs.bus.ports import Producer
from libs.telemetry import replaying

log = logging.getLogger(__name__)

# Snapshots are large records: read and write them whole (the topic allows 64 MiB).
_LARGE = 64 << 20


class SnapshotStore:
    def __init__(
        self, bus: Bus, topic: TopicSpec, *, client_id: str = "placement-snapshots"
    ) -> None:
        self._bus = bus
        self._topic = topic.name
        self._partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        self._client_id = client_id
        self._producer: Producer | None = None  # made at the first save: most never save

    async def save(self, snapshot: snapshot_pb2.PlacementSnapshot) -> None:
        """Write ``snapshot`` as its partition's latest (acknowledged before returning)."""
        if self._producer is None:
            self._producer = self._bus.producer(client_id=self._client_id, max_request_size=_LARGE)
            await self._producer.start()
        sent = await self._producer.send(
            self._topic,
            value=snapshot.SerializeToString(),
            key=str(snapshot.input_partition).encode(),
        )
        await sent

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def latest(self, partition: int, upto: int) -> snapshot_pb2.PlacementSnapshot | None:
        """The newest snapshot of input ``partition`` taken at or before offset ``upto``."""
        found: snapshot_pb2.PlacementSnapshot | None = None
        reader = self._bus.consumer(
            client_id=self._client_id,
            max_partition_fetch_bytes=_LARGE,
            fetch_max_bytes=_LARGE,
        )
        await reader.start()
        try:
            tps = self._partitions
            reader.assign(tps)
            ends = await reader.end_offsets(tps)
            for tp in tps:
                await reader.seek_to_beginning(tp)
                while await reader.position(tp) < ends[tp]:
                    with replaying():
                        polled = await reader.getmany(tp, timeout_ms=1000)
                    for record in polled.get(tp, []):
                        snapshot = _parse(record.value, record.offset)
                        if (
                            snapshot is not None
                            and snapshot.input_partition == partition
                            and snapshot.next_offset <= upto
                            and (found is None or snapshot.next_offset >= found.next_offset)
                        ):
                            found = snapshot
        finally:
            await reader.stop()
        return found


def _parse(value: bytes | None, offset: int) -> snapshot_pb2.PlacementSnapshot | None:
    try:
        return snapshot_pb2.PlacementSnapshot.FromString(value or b"")
    except DecodeError:
        log.warning("the snapshot record at offset %d does not decode; passed over", offset)
        return None
