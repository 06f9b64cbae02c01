"""Read a whole topic from the start, then follow it: how services rebuild state.

No consumer group: every reader sees every partition. Undecodable records are
skipped here; the group consumers of the same topic dead-letter them. A reader that
checks who signed each record (``libs.trust``) takes the record's bytes with its
envelope: ``catch_up_records`` and ``follow_records``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2

from libs.bus.lag import LagMeter
from libs.bus.ports import Bus
from libs.events import DecodeError, decode
from libs.telemetry import replaying

Apply = Callable[[events_pb2.Envelope], None]
# An envelope and the record it was decoded from, exactly as written.
ApplyRecord = Callable[[events_pb2.Envelope, bytes], None]


class TopicMissing(RuntimeError):
    """A topic to read is not on the cluster (or not visible to this client's account)."""


class LogReader:
    def __init__(self, bus: Bus, topic: str, *, name: str | None = None) -> None:
        self._topic = topic
        self._consumer = bus.consumer()
        # Only a reader that follows for its service's life has a lag worth showing.
        self._lag = None if name is None else LagMeter(self._consumer, name)
        self._partitions: list[TopicPartition] = []
        # Per partition, the offset after the last record applied; waiters are woken
        # after every poll.
        self._applied: dict[TopicPartition, int] = {}
        self._progress = asyncio.Event()

    async def start(self, offsets: Mapping[int, int] | None = None) -> None:
        """Assign every partition, from the start or, where ``offsets`` names one (a
        snapshot's), from there."""
        await self._consumer.start()
        if self._topic not in await self._consumer.topics():
            await self._consumer.stop()
            raise TopicMissing(f"topic {self._topic} does not exist; run `python -m libs.bus`")
        # Without a group, subscribing assigns every partition, from the earliest offset.
        self._consumer.subscribe([self._topic])
        while not self._consumer.assignment():
            await asyncio.sleep(0.05)
        self._partitions = sorted(self._consumer.assignment())
        for tp in self._partitions:
            if offsets and tp.partition in offsets:
                self._consumer.seek(tp, offsets[tp.partition])
                self._applied[tp] = offsets[tp.partition]

    def offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last record applied (where a reader
        that resumed from a snapshot of what was applied would start)."""
        return {tp.partition: self._applied.get(tp, 0) for tp in self._partitions}

    async def stop(self) -> None:
        await self._consumer.stop()

    async def catch_up(self, apply: Apply) -> int:
        """Apply every record up to the current end of the topic; return how many."""
        return await self.catch_up_records(_envelope_only(apply))

    async def catch_up_records(self, apply: ApplyRecord) -> int:
        """``catch_up``, applying each envelope with its record's bytes."""
        ends = await self._consumer.end_offsets(self._partitions)
        count = 0
        while await self._behind(ends):
            count += await self._poll(apply)
        return count

    async def _behind(self, ends: Mapping[TopicPartition, int]) -> bool:
        for tp in self._partitions:
            if await self._consumer.position(tp) < ends[tp]:
                return True
        return False

    async def follow(self, apply: Apply) -> None:
        await self.follow_records(_envelope_only(apply))

    async def follow_records(self, apply: ApplyRecord) -> None:
        """``follow``, applying each envelope with its record's bytes."""
        while True:
            await self._poll(apply)

    async def reached(self, tp: TopicPartition, offset: int) -> None:
        """Return once the record at ``offset`` of ``tp`` has been applied (by
        ``catch_up`` or ``follow``, which must be running)."""
        while self._applied.get(tp, 0) <= offset:
            progress = self._progress
            await progress.wait()

    async def _poll(self, apply: ApplyRecord) -> int:
        with replaying():
            polled = await self._consumer.getmany(timeout_ms=500, max_records=10_000)
        count = 0
        for tp, records in polled.items():
            for record in records:
                try:
                    env = decode(record.value)
                except DecodeError:
                    continue
                apply(env, record.value or b"")  # decoded: never empty
                count += 1
            if records:
                self._applied[tp] = records[-1].offset + 1
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()
        if self._lag is not None:
            await self._lag.polled()
        return count


def _envelope_only(apply: Apply) -> ApplyRecord:
    return lambda env, record: apply(env)
