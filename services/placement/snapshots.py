"""Placement's snapshots on the bus: one record per input partition (keyed by it) on a
compacted topic, the latest. One that does not decode, or was taken past the offset a
new owner resumes from, is passed over with a warning: a snapshot is only ever a
shortcut past folding the log."""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError
from qm.v1 import snapshot_pb2

from libs.bus import Bus, TopicSpec
from libs.bus.compacted import CompactedTopic
from libs.events.snapshot import key

log = logging.getLogger(__name__)


class SnapshotStore:
    def __init__(
        self, bus: Bus, topic: TopicSpec, *, client_id: str = "placement-snapshots"
    ) -> None:
        self._topic = CompactedTopic(bus, topic, client_id=client_id)

    async def save(self, snapshot: snapshot_pb2.PlacementSnapshot) -> None:
        await self._topic.put(key(snapshot.input_partition), snapshot.SerializeToString())

    async def latest(self, partition: int, upto: int) -> snapshot_pb2.PlacementSnapshot | None:
        """The latest snapshot of input ``partition``, if taken at or before offset ``upto``."""
        value = (await self._topic.latest()).get(key(partition))
        if value is None:
            return None
        try:
            snapshot = snapshot_pb2.PlacementSnapshot.FromString(value)
        except DecodeError:
            log.warning("partition %d: its snapshot record does not decode", partition)
            return None
        if snapshot.input_partition != partition or snapshot.next_offset > upto:
            log.warning(
                "partition %d: its snapshot (partition %d, offset %d) is not of offset %d "
                "or before",
                partition,
                snapshot.input_partition,
                snapshot.next_offset,
                upto,
            )
            return None
        return snapshot

    async def stop(self) -> None:
        await self._topic.stop()
