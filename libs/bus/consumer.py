"""Consume envelopes; undecodable records go to the dead-letter topic."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from opentelemetry.context import Context
from qm.v1 import events_pb2

from libs.bus.deadletter import dead_letter
from libs.bus.lag import LagMeter
from libs.bus.ports import Bus, Consumer, OffsetReset, RebalanceListener, Record
from libs.bus.producer import EventProducer
from libs.events import DecodeError, decode
from libs.telemetry import processing_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """One decoded record, where it sits in the log, and the trace context to act on it
    in (under its consumer span, ``libs.telemetry.processing_context``)."""

    envelope: events_pb2.Envelope
    topic: str
    partition: int
    offset: int
    context: Context
    # The record as it came (its bytes are what a signature covers).
    record: Record | None = None

    @property
    def value(self) -> bytes:
        """The record's bytes as they came (empty for a delivery made in a test)."""
        return (self.record.value or b"") if self.record is not None else b""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class EventConsumer:
    """Wraps one consumer of a bus (committed records only; offsets committed by the
    caller once it has acted on them)."""

    def __init__(
        self,
        bus: Bus,
        topics: list[str],
        *,
        name: str,
        deadletter_topic: str,
        deadletter_producer: EventProducer,
        group_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        client_id: str | None = None,
        **tuning: Any,
    ) -> None:
        """``name`` labels its metrics and dead letters; ``client_id`` (default ``name``)
        names it to the bus; ``tuning``: the bus's client options (session timeout...)."""
        self.name = name
        self._topics = topics
        self._deadletter_topic = deadletter_topic
        self._deadletter_producer = deadletter_producer
        self._consumer = bus.consumer(
            client_id=client_id or name,
            group_id=group_id,
            auto_offset_reset=auto_offset_reset,
            **tuning,
        )
        self._lag = LagMeter(self._consumer, name)
        self._rebalances = _Rebalances(None)

    @property
    def client(self) -> Consumer:
        return self._consumer

    async def start(self, *, listener: RebalanceListener | None = None) -> None:
        await self._consumer.start()
        self._rebalances = _Rebalances(listener)
        self._consumer.subscribe(self._topics, listener=self._rebalances)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def batches(self, timeout_ms: int = 500) -> AsyncIterator[list[Delivery]]:
        """Yield decoded records a batch at a time (possibly empty), forever; never one
        polled before the group's latest rebalance."""
        while True:
            polled = await self._consumer.getmany(timeout_ms=timeout_ms)
            rebalances = self._rebalances.count
            batch: list[Delivery] = []
            for records in polled.values():
                for record in records:
                    delivery = await self.decode(record)  # a dead letter is sent: it waits
                    if delivery is not None:
                        batch.append(delivery)
            await self._lag.polled()  # asks the broker: it waits, maybe out a restart
            if self._rebalances.count != rebalances:
                # The group moved partitions meanwhile and set every position back to
                # its committed offset: these records are read again, and handing them
                # over now would have them acted on twice.
                log.info(
                    "%s: %d records polled before a rebalance are read again", self.name, len(batch)
                )
                continue
            yield batch

    async def decode(self, record: Record) -> Delivery | None:
        try:
            env = decode(record.value)
        except DecodeError as exc:
            await dead_letter(
                self._deadletter_producer,
                self._deadletter_topic,
                record,
                reason=str(exc),
                consumer=self.name,
            )
            return None
        return Delivery(
            envelope=env,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            context=processing_context(record),
            record=record,
        )


class _Rebalances(ConsumerRebalanceListener):  # type: ignore[misc]
    """Counts the group's moves of partitions, and tells the caller's listener of them."""

    def __init__(self, listener: RebalanceListener | None) -> None:
        self.count = 0
        self._listener = listener

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.count += 1
        if self._listener is not None:
            await self._listener.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.count += 1
        if self._listener is not None:
            await self._listener.on_partitions_assigned(assigned)
