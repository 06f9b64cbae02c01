"""What services need of a message bus, as protocols: Kafka and memory implement them.

The protocols are the slice of aiokafka's clients the services use, so that
``libs.bus.kafka.KafkaBus`` hands out aiokafka's clients as they are and
``libs.bus.memory.MemoryBus`` stands in for a broker in tests. The envelope-level
wrappers (``EventProducer``, ``EventConsumer``, ``LogReader``) are built on them
and are the same code over either bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from aiokafka.structs import RecordMetadata, TopicPartition

OffsetReset = Literal["earliest", "latest"]


class Located(Protocol):
    """Where a record sits in the log: a bus record, or a faust message in the projector."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


class Record(Located, Protocol):
    """One consumed record and where it sits in the log."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


class RebalanceListener(Protocol):
    """Told when a consumer group moves partitions (aiokafka needs a subclass of its
    ``ConsumerRebalanceListener``; the memory bus takes any such object)."""

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...
    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


class Consumer(Protocol):
    """A consumer that reads committed records only and never commits by itself."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def topics(self) -> set[str]: ...
    def subscribe(
        self, topics: Sequence[str], *, listener: RebalanceListener | None = None
    ) -> None: ...
    def assign(self, partitions: Sequence[TopicPartition]) -> None: ...
    def assignment(self) -> set[TopicPartition]: ...
    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> Mapping[TopicPartition, Sequence[Record]]: ...
    async def position(self, tp: TopicPartition) -> int: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    async def seek_to_beginning(self, *partitions: TopicPartition) -> Any: ...
    async def end_offsets(
        self, partitions: Sequence[TopicPartition]
    ) -> Mapping[TopicPartition, int]: ...
    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None: ...
    async def committed(self, tp: TopicPartition) -> int | None:
        """The consumer group's committed offset of ``tp`` (None: never committed), read
        afresh from the bus: whoever committed it, even without joining the group."""
        ...


class Producer(Protocol):
    """An idempotent, acks=all producer; transactional when built with a transactional id."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the future resolves once the bus has it."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """Records sent inside are read (committed) all together or not at all; an
        exception aborts them."""
        ...

    async def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_id: str
    ) -> None:
        """Commit ``group_id``'s offsets with the open transaction."""
        ...


class Bus(Protocol):
    """Where clients come from: the one place a service gets its consumers and producers."""

    def consumer(
        self,
        *,
        client_id: str | None = None,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        **tuning: Any,
    ) -> Consumer:
        """``tuning``: client options that change no semantics (fetch sizes...)."""
        ...

    def producer(
        self, *, client_id: str | None = None, transactional_id: str | None = None, **tuning: Any
    ) -> Producer: ...
