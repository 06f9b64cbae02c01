"""The standby: keeps warm the input partitions this instance does not decide.

Every placement instance folds, besides the partitions it owns, every other input
partition up to the offset the group has committed for it, so that when the group
hands it one (its owner died, or left), it decides from there at once instead of
folding the log. Folding stops at the committed offset because that is where a new
owner resumes: records past it may yet be decided again, and a state folded beyond
the resumption point could not be wound back.

A partition's state starts from its latest snapshot when one loads (see
``services/placement/snapshots.py``), else from nothing; the same path warms a
partition the instance is handed cold. One consumer serves it all: it is assigned
every partition and never joins the group, only reads the group's committed offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from libs.bus import Bus, TopicSpec
from libs.bus.ports import Consumer, Record
from libs.core import PolicyConfig
from libs.events import DecodeError, decode
from libs.events.log_step import PartitionSchedulers
from libs.events.snapshot import SnapshotError, restore
from libs.telemetry import replaying
from libs.telemetry.metrics import STANDBY_BEHIND
from libs.trust import Gate
from services.placement.snapshots import SnapshotStore

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the group's committed offsets are read
CHUNK = 500  # records folded between yields to the event loop (heartbeats, decisions)


@dataclass
class Warm:
    """One partition's schedulers, having folded every record before ``offset``."""

    schedulers: PartitionSchedulers
    offset: int
    snapshot_offset: int = 0  # where the snapshot it started from was taken (0: none)


class Standby:
    def __init__(
        self,
        bus: Bus,
        events: TopicSpec,
        *,
        group_id: str,
        policy: PolicyConfig,
        store: SnapshotStore,
        gate: Gate | None = None,
        client_id: str = "placement-standby",
    ) -> None:
        self._events = events
        self._policy = policy
        self._store = store
        self._gate = gate
        # With the group's id but assigned, not subscribed: it reads the group's
        # committed offsets and never joins it.
        self._consumer: Consumer = bus.consumer(client_id=client_id, group_id=group_id)
        self._warm: dict[int, Warm] = {}
        self._following: set[int] = set()
        self._committed: dict[int, int] = {}
        self._lock = asyncio.Lock()  # one fold at a time: the loop's, or a hand-over's
        self._started = asyncio.Event()

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self._events.name, partition)

    async def run(self) -> None:
        await self._consumer.start()
        self._consumer.assign([self._tp(p) for p in range(self._events.partitions)])
        self._started.set()
        try:
            while True:
                async with self._lock:
                    folded = await self._follow()
                if not folded:
                    await asyncio.sleep(POLL_S)
                else:
                    await asyncio.sleep(0)
        finally:
            await self._consumer.stop()

    def follow(self, partitions: set[int]) -> None:
        """Keep exactly ``partitions`` warm (those this instance does not own)."""
        self._following = set(partitions)
        for partition in set(self._warm) - self._following:
            del self._warm[partition]

    def give(self, partition: int, warm: Warm) -> None:
        """A partition this instance gave up, with its state: keep following it."""
        self._warm[partition] = warm
        self._following.add(partition)

    async def take(self, partition: int, upto: int) -> Warm:
        """The partition's state at exactly ``upto`` (the offset its new owner, this
        instance, resumes from); no longer followed."""
        await self._started.wait()
        async with self._lock:
            self._following.discard(partition)
            warm = self._warm.pop(partition, None)
            if warm is None or warm.offset > upto:
                warm = await self._cold(partition, upto)
            await self._fold(partition, warm, upto)
            return warm

    async def _follow(self) -> int:
        """Fold what the group has committed past each followed partition's state."""
        folded = 0
        for partition in sorted(self._following):
            tp = self._tp(partition)
            committed = await self._consumer.committed(tp) or 0
            warm = self._warm.get(partition)
            if warm is None or warm.offset > committed:
                warm = self._warm[partition] = await self._cold(partition, committed)
            STANDBY_BEHIND.labels(str(partition)).set(committed - warm.offset)
            folded += await self._fold(partition, warm, committed, limit=CHUNK)
        return folded

    async def _cold(self, partition: int, upto: int) -> Warm:
        """A partition's state from its latest loadable snapshot, else from nothing."""
        snapshot = await self._store.latest(partition, upto)
        if snapshot is not None:
            try:
                schedulers = restore(snapshot, self._policy, self._gate)
            except SnapshotError as exc:
                log.warning(
                    "partition %d: the snapshot at offset %d is not loaded (%s); folding "
                    "the log from the start",
                    partition,
                    snapshot.next_offset,
                    exc,
                )
            else:
                log.info(
                    "partition %d: loaded the snapshot at offset %d",
                    partition,
                    snapshot.next_offset,
                )
                return Warm(schedulers, snapshot.next_offset, snapshot.next_offset)
        return Warm(PartitionSchedulers(self._policy, gate=self._gate), 0)

    async def _fold(
        self, partition: int, warm: Warm, upto: int, *, limit: int | None = None
    ) -> int:
        """Fold records [warm.offset, upto) of the partition (at most ``limit``)."""
        tp = self._tp(partition)
        folded = 0
        if warm.offset >= upto:
            return folded
        self._consumer.seek(tp, warm.offset)
        while warm.offset < upto and (limit is None or folded < limit):
            with replaying():
                polled = await self._consumer.getmany(tp, timeout_ms=1000, max_records=CHUNK)
            folded += absorb(warm, polled.get(tp, []), upto)
            if await self._consumer.position(tp) >= upto:
                # Read past it: whatever was not folded was aborted or a transaction marker.
                warm.offset = upto
            await asyncio.sleep(0)  # heartbeats and decisions, between chunks
        return folded


def absorb(warm: Warm, records: Sequence[Record], upto: int) -> int:
    """Fold the records before ``upto`` that ``warm`` has not; return how many."""
    count = 0
    for record in records:
        if record.offset < warm.offset:
            continue
        if record.offset >= upto:
            break
        try:
            env = decode(record.value)
        except DecodeError:
            pass  # dead-lettered by the partition's owner
        else:
            warm.schedulers.fold(env, record.value or b"")
        warm.offset = record.offset + 1
        count += 1
    return count
