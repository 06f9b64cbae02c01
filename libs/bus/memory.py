"""A bus in memory, for tests: topics of partitions, keyed partitioning, consumer
groups with positions and committed offsets, transactions; no broker, no clock.

It keeps the Kafka semantics the services rely on (``tests/integration/test_bus_contract.py``
runs the same cases against it and the real broker): a key always lands on the
partition Kafka's default partitioner picks; consumers read committed records
only (a transaction's records stay invisible until it commits, and aborted ones
are skipped); starting a producer with a transactional id fences the one that had it
(its open transaction is aborted, and it can commit nothing more); a group's
partitions are shared among its members, revoked from all and assigned again
(listeners awaited) whenever one joins or leaves; a group resumes from its committed
offsets, else from ``auto_offset_reset``; a record over the producer's
``max_request_size`` is refused when sent, as aiokafka refuses it. It is deterministic:
no randomness, no wall clock (a keyless record goes round-robin).

With ``lagging_offsets`` it keeps one more broker behaviour: a transaction's commit is
answered before the group's offsets take it in, so an offset fetch right after it reads
the offset from before; they take it in when the transaction completes, which starting
a producer with the same transactional id waits for (``complete_transactions``: all).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.errors import (
    IllegalOperation,
    IllegalStateError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import RecordMetadata, TopicPartition
from qm.v1 import events_pb2

from libs.bus.ports import Bus, OffsetReset, RebalanceListener
from libs.bus.topics import Topics
from libs.events import DecodeError, decode

MAX_REQUEST_SIZE = 1_048_576  # aiokafka's producer default


@dataclass(frozen=True)
class MemoryRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class _Entry:
    record: MemoryRecord
    state: Literal["pending", "committed", "aborted"]


@dataclass
class _Group:
    members: list[MemoryConsumer] = field(default_factory=list)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    # One rebalance at a time, as a group coordinator would.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MemoryBus:
    """A ``libs.bus.ports.Bus`` in memory. Topics not created beforehand get
    ``default_partitions`` on first use, as a broker that auto-creates topics would."""

    def __init__(
        self,
        partitions: Mapping[str, int] | None = None,
        *,
        default_partitions: int = 1,
        lagging_offsets: bool = False,
    ) -> None:
        self._default_partitions = default_partitions
        self._lagging_offsets = lagging_offsets
        # Committed transactions' offsets the groups have not taken in yet, by
        # transactional id (only with ``lagging_offsets``).
        self._completing: dict[str, list[tuple[str, dict[TopicPartition, int]]]] = {}
        self._logs: dict[str, list[list[_Entry]]] = {}
        self._groups: dict[str, _Group] = {}
        # The producer that holds each transactional id (the latest started).
        self._transactional: dict[str, MemoryProducer] = {}
        self._keyless = itertools.count()
        self._changed = asyncio.Event()
        # While down, sends are taken but never acknowledged, and nothing is written.
        self.down = False
        # The next this many sends fail, as to a broker that does not answer in time.
        self.refusals = 0
        # The next this many transactional producers fail to start (InitProducerId).
        self.failed_starts = 0
        for topic, count in (partitions or {}).items():
            self.create_topic(topic, count)

    @classmethod
    def for_topics(cls, topics: Topics, *, lagging_offsets: bool = False) -> MemoryBus:
        """The topics of a topics file, with their partition counts."""
        partitions = {spec.name: spec.partitions for spec in topics.all()}
        return cls(partitions, lagging_offsets=lagging_offsets)

    def create_topic(self, topic: str, partitions: int) -> None:
        self._logs.setdefault(topic, [[] for _ in range(partitions)])

    # A client id and tuning (``ignored``) mean nothing in memory.

    def consumer(
        self,
        *,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        **ignored: Any,
    ) -> MemoryConsumer:
        return MemoryConsumer(self, group_id=group_id, auto_offset_reset=auto_offset_reset)

    def producer(
        self,
        *,
        transactional_id: str | None = None,
        max_request_size: int = MAX_REQUEST_SIZE,
        **ignored: Any,
    ) -> MemoryProducer:
        return MemoryProducer(
            self, transactional_id=transactional_id, max_request_size=max_request_size
        )

    # What tests look at.

    def records(self, topic: str) -> list[MemoryRecord]:
        """The committed records of a topic, partition by partition, in offset order."""
        return [
            entry.record
            for log in self._logs.get(topic, [])
            for entry in log
            if entry.state == "committed"
        ]

    def envelopes(self, topic: str) -> list[events_pb2.Envelope]:
        """The committed records of a topic that decode, as ``records`` orders them."""
        decoded = []
        for record in self.records(topic):
            try:
                decoded.append(decode(record.value))
            except DecodeError:
                continue
        return decoded

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """The offsets a consumer group has committed."""
        return dict(self._group(group_id).committed)

    def complete_transactions(self, transactional_id: str | None = None) -> None:
        """The groups take in the offsets of the committed transactions (of one
        transactional id, or all)."""
        ids = list(self._completing) if transactional_id is None else [transactional_id]
        for completed in ids:
            for group_id, offsets in self._completing.pop(completed, []):
                self._group(group_id).committed.update(offsets)
        self._notify()

    async def until(self, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Return once ``condition`` holds, checking after every change to the bus and
        every few milliseconds (what consumers do with their records changes no bus)."""
        async with asyncio.timeout(timeout_s):
            while not condition():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.005)

    # The broker's side.

    def _partitions(self, topic: str) -> list[list[_Entry]]:
        self.create_topic(topic, self._default_partitions)
        return self._logs[topic]

    def _topic_partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        return sorted(
            TopicPartition(topic, partition)
            for topic in topics
            for partition in range(len(self._partitions(topic)))
        )

    def _log(self, tp: TopicPartition) -> list[_Entry]:
        return self._partitions(tp.topic)[tp.partition]

    def _stable_end(self, tp: TopicPartition) -> int:
        """The last stable offset: read_committed consumers read no further."""
        log = self._log(tp)
        return next((e.record.offset for e in log if e.state == "pending"), len(log))

    def _append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        *,
        pending: bool,
    ) -> _Entry:
        partitions = self._partitions(topic)
        numbers = list(range(len(partitions)))
        if key is None:
            partition = next(self._keyless) % len(numbers)
        else:
            partition = DefaultPartitioner()(key, numbers, numbers)
        log = partitions[partition]
        record = MemoryRecord(topic, partition, len(log), key, value, tuple(headers))
        entry = _Entry(record, "pending" if pending else "committed")
        log.append(entry)
        return entry

    def _group(self, group_id: str) -> _Group:
        return self._groups.setdefault(group_id, _Group())

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _rebalance(self, group_id: str) -> None:
        """Revoke every member's partitions, then share them out again, round-robin."""
        group = self._group(group_id)
        async with group.lock:
            members = list(group.members)
            for member in members:
                await member._revoke()
            shares: dict[int, list[TopicPartition]] = {id(m): [] for m in members}
            for tp in self._topic_partitions(sorted({t for m in members for t in m._topics})):
                takers = [m for m in members if tp.topic in m._topics]
                taker = takers[tp.partition % len(takers)]
                shares[id(taker)].append(tp)
            for member in members:
                await member._assign(shares[id(member)])
        self._notify()


class MemoryConsumer:
    """A ``libs.bus.ports.Consumer`` of a ``MemoryBus``."""

    def __init__(
        self, bus: MemoryBus, *, group_id: str | None, auto_offset_reset: OffsetReset
    ) -> None:
        self._bus = bus
        self._group_id = group_id
        self._reset = auto_offset_reset
        self._topics: list[str] = []
        self._listener: RebalanceListener | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._started = False
        self._joining: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._started = True
        if self._topics:
            self._join()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        await self._joined()
        if self._group_id is not None and self in self._bus._group(self._group_id).members:
            self._bus._group(self._group_id).members.remove(self)
            await self._bus._rebalance(self._group_id)
        self._positions.clear()

    async def topics(self) -> set[str]:
        return set(self._bus._logs)

    def subscribe(
        self, topics: Sequence[str], *, listener: RebalanceListener | None = None
    ) -> None:
        self._topics = list(topics)
        self._listener = listener
        if self._started:
            self._join()

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._positions = {tp: self._reset_position(tp) for tp in partitions}

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[MemoryRecord]]:
        """What is there now; else wait up to ``timeout_ms`` for something to read."""
        await self._joined()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            changed = self._bus._changed
            polled = self._fetch(partitions or tuple(sorted(self._positions)), max_records)
            remaining = deadline - loop.time()
            if polled or remaining <= 0:
                return polled
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return {}

    async def position(self, tp: TopicPartition) -> int:
        await self._joined()
        self._assigned(tp)
        return self._positions[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._assigned(tp)
        self._positions[tp] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> bool:
        for tp in partitions or tuple(self._positions):
            self.seek(tp, 0)
        return True

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._bus._stable_end(tp) for tp in partitions}

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if self._group_id is None:
            raise IllegalOperation("a consumer without a group cannot commit")
        for tp in offsets:
            self._assigned(tp)
        self._bus._group(self._group_id).committed.update(offsets)
        self._bus._notify()

    async def committed(self, tp: TopicPartition) -> int | None:
        if self._group_id is None:
            raise IllegalOperation("a consumer without a group has no committed offsets")
        return self._bus._group(self._group_id).committed.get(tp)

    def _fetch(
        self, partitions: Sequence[TopicPartition], max_records: int | None
    ) -> dict[TopicPartition, list[MemoryRecord]]:
        budget = max_records if max_records is not None else 1 << 62
        polled: dict[TopicPartition, list[MemoryRecord]] = {}
        for tp in partitions:
            log, position = self._bus._log(tp), self._positions[tp]
            end = self._bus._stable_end(tp)
            records: list[MemoryRecord] = []
            while position < end and len(records) < budget:
                if log[position].state == "committed":
                    records.append(log[position].record)
                position += 1  # past aborted records too, as Kafka's consumer does
            self._positions[tp] = position
            budget -= len(records)
            if records:
                polled[tp] = records
        return polled

    def _assigned(self, tp: TopicPartition) -> None:
        if tp not in self._positions:
            raise IllegalStateError(f"partition {tp} is not assigned")

    def _reset_position(self, tp: TopicPartition) -> int:
        if self._group_id is not None:
            committed = self._bus._group(self._group_id).committed.get(tp)
            if committed is not None:
                return committed
        return self._bus._stable_end(tp) if self._reset == "latest" else 0

    def _join(self) -> None:
        """Join the group (or take every partition, without one) in the background, as
        aiokafka's coordinator does: the assignment shows up a moment later."""
        if self._group_id is None:
            joining = self._take_all()
        else:
            group = self._bus._group(self._group_id)
            if self not in group.members:
                group.members.append(self)
            joining = self._bus._rebalance(self._group_id)
        self._joining = asyncio.ensure_future(joining)

    async def _joined(self) -> None:
        if self._joining is not None:
            await self._joining

    async def _take_all(self) -> None:
        await self._revoke()
        await self._assign(self._bus._topic_partitions(self._topics))
        self._bus._notify()

    async def _revoke(self) -> None:
        revoked = set(self._positions)
        self._positions.clear()
        if self._listener is not None:
            await self._listener.on_partitions_revoked(revoked)

    async def _assign(self, partitions: Sequence[TopicPartition]) -> None:
        self.assign(partitions)
        if self._listener is not None:
            await self._listener.on_partitions_assigned(set(partitions))


@dataclass
class _Transaction:
    entries: list[_Entry] = field(default_factory=list)
    offsets: list[tuple[str, dict[TopicPartition, int]]] = field(default_factory=list)


class MemoryProducer:
    """A ``libs.bus.ports.Producer`` of a ``MemoryBus``."""

    def __init__(
        self, bus: MemoryBus, *, transactional_id: str | None, max_request_size: int
    ) -> None:
        self._bus = bus
        self._transactional_id = transactional_id
        self._max_request_size = max_request_size
        self._transaction: _Transaction | None = None

    async def start(self) -> None:
        if self._transactional_id is None:
            return
        if self._bus.failed_starts:
            self._bus.failed_starts -= 1
            raise KafkaTimeoutError()
        self._bus.complete_transactions(self._transactional_id)  # InitProducerId waits
        fenced = self._bus._transactional.get(self._transactional_id)
        self._bus._transactional[self._transactional_id] = self
        if fenced is not None and fenced._transaction is not None:
            for entry in fenced._transaction.entries:
                entry.state = "aborted"
            fenced._transaction.entries.clear()
            self._bus._notify()

    async def stop(self) -> None:
        pass

    @property
    def _fenced(self) -> bool:
        holder = self._bus._transactional.get(self._transactional_id or "")
        return holder is not None and holder is not self

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        if self._bus.refusals:
            self._bus.refusals -= 1
            raise KafkaTimeoutError()
        # Measured as aiokafka measures it, and refused as it refuses, before it is queued.
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers or ()))
        if size > self._max_request_size:
            raise MessageSizeTooLargeError(
                f"the record is {size} bytes, over max_request_size {self._max_request_size}"
            )
        written: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if self._bus.down:
            return written
        transaction = self._transaction
        entry = self._bus._append(topic, value, key, headers or (), pending=transaction is not None)
        if transaction is not None:
            transaction.entries.append(entry)
        else:
            self._bus._notify()
        record = entry.record
        tp = TopicPartition(record.topic, record.partition)
        # No timestamps: the bus reads no clock.
        written.set_result(RecordMetadata(tp.topic, tp.partition, tp, record.offset, -1, 0, 0))
        return written

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        transactional_id = self._transactional_id
        if transactional_id is None:
            raise IllegalOperation("the producer has no transactional id")
        if self._transaction is not None:
            raise IllegalOperation("a transaction is already open")
        transaction = self._transaction = _Transaction()
        try:
            yield
            if self._fenced:
                raise ProducerFenced()
        except BaseException:
            for entry in transaction.entries:
                entry.state = "aborted"
            raise
        else:
            for entry in transaction.entries:
                entry.state = "committed"
            completing = self._bus._completing.setdefault(transactional_id, [])
            completing.extend(transaction.offsets)
            if not self._bus._lagging_offsets:
                self._bus.complete_transactions(transactional_id)
        finally:
            self._transaction = None
            self._bus._notify()

    async def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_id: str
    ) -> None:
        if self._transaction is None:
            raise IllegalOperation("no transaction is open")
        self._transaction.offsets.append((group_id, dict(offsets)))


# Checked by mypy: the memory bus is a ``Bus`` (its clients are its consumers and producers).
_CONFORMS: type[Bus] = MemoryBus
