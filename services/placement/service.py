"""The placement loop: consume the event log, decide, emit, all in one transaction.

Each poll's decisions and the consumer offsets that produced them are
committed in one Kafka transaction, so a crash never loses or doubles a
decision. Before the first record of a newly assigned partition is decided,
the scheduler state for that partition is rebuilt by replaying the log up to
that record (outputs suppressed): the state is a pure function of the log.

The loop stays in its consumer group: it yields to the event loop between
records, so the consumer's heartbeats go out however long a batch takes (the
core bounds the cost of any one record). If the group rebalances anyway while a
batch is decided, the batch's transaction is aborted rather than committed:
aiokafka commits offsets in a transaction without the group's generation
(KIP-447), so the broker would accept them from a member that no longer owns
the partition, and the next owner would decide the same records again. Aborted,
the records are decided once more from the committed offsets, by whoever owns
them now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from qm.v1 import events_pb2

from libs.bus import Bus, Delivery, EventConsumer, EventProducer, Topics
from libs.core import PolicyConfig
from libs.events import DecodeError, decode, event_type
from libs.events.driver import PartitionSchedulers, step
from libs.telemetry import replaying
from libs.telemetry.metrics import DECISION_DELAY_SECONDS, DECISION_SECONDS, DECISIONS

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass
class PlacementService:
    bus: Bus
    topics: Topics
    # Also the transactional id: a restarted (or standby) instance fences the old one.
    group_id: str = "qm-placement"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # What this instance last committed, so an idle poll costs no broker round trip.
    _committed: dict[TopicPartition, int] = field(default_factory=dict)
    schedulers: dict[int, PartitionSchedulers] = field(default_factory=dict)
    # Bumped by every rebalance: a batch decided across one is not committed.
    generation: int = 0
    # Set once the group has assigned this instance its partitions (maybe none: a standby).
    ready: bool = False

    async def run(self) -> None:
        producer = EventProducer(self.bus, client_id="placement", transactional_id=self.group_id)
        deadletters = EventProducer(self.bus, client_id="placement-dlq")
        consumer = EventConsumer(
            self.bus,
            [self.topics.events.name],
            name="placement",
            group_id=self.group_id,
            deadletter_topic=self.topics.deadletter.name,
            deadletter_producer=deadletters,
        )
        await producer.start()
        await deadletters.start()
        await consumer.start(listener=_Rebalance(self))
        try:
            async for batch in consumer.batches():
                if not consumer.client.assignment():
                    continue
                try:
                    await self._commit(producer, consumer, batch)
                except Rebalanced:
                    log.warning(
                        "the group rebalanced while %d records were decided: their "
                        "transaction is aborted; they are decided again from the committed "
                        "offsets",
                        len(batch),
                    )
        finally:
            await consumer.stop()
            await producer.stop()
            await deadletters.stop()

    async def _commit(
        self, producer: EventProducer, consumer: EventConsumer, batch: list[Delivery]
    ) -> None:
        client = consumer.client
        generation = self.generation
        for delivery in batch:
            if delivery.partition not in self.schedulers:
                await self.rebuild(delivery.topic_partition, delivery.offset)
        # The positions cover dead-lettered records too, so those are not re-read.
        offsets = {tp: await client.position(tp) for tp in client.assignment()}
        if not batch and all(self._committed.get(tp) == offset for tp, offset in offsets.items()):
            return
        decided: list[tuple[events_pb2.Envelope, list[events_pb2.Envelope]]] = []
        async with producer.client.transaction():  # an exception aborts it
            acks = []
            for delivery in batch:
                self._still_owner(generation)
                outputs, queued = await self._decide(producer, delivery)
                acks.extend(queued)
                decided.append((delivery.envelope, outputs))
                await asyncio.sleep(0)  # the consumer's heartbeat runs between records
            await asyncio.gather(*acks)
            self._still_owner(generation)
            await producer.client.send_offsets_to_transaction(offsets, self.group_id)
            self._still_owner(generation)
        self._committed.update(offsets)
        _count(decided, time.time())

    def _still_owner(self, generation: int) -> None:
        if self.generation != generation:
            raise Rebalanced

    async def _decide(
        self, producer: EventProducer, delivery: Delivery
    ) -> tuple[list[events_pb2.Envelope], list[Any]]:
        """Decide one record under its consumer span, and queue its outputs inside: each
        decision's produce span is a child of the record's, in the trace that sent it.
        Returns the outputs and their acknowledgements."""
        env = delivery.envelope
        with tracer.start_as_current_span(
            f"placement {event_type(env)}",
            context=delivery.context,
            attributes={
                "qm.event_id": env.event_id,
                "qm.partition": delivery.partition,
                "qm.offset": delivery.offset,
            },
        ):
            started = time.perf_counter()
            outputs = self.outputs(delivery)
            DECISION_SECONDS.labels(event_type(env)).observe(time.perf_counter() - started)
            acks = []
            for out in outputs:
                log.info("%s %s", event_type(out), out.correlation_id)
                acks.append(
                    await producer.enqueue(self.topics.decisions.name, out, key=out.cluster)
                )
            return outputs, acks

    def outputs(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        """The decisions one input record causes."""
        schedulers = self.schedulers.get(delivery.partition)
        if schedulers is None:  # revoked since the batch began
            raise Rebalanced
        return schedulers.decide(
            delivery.envelope, partition=delivery.partition, offset=delivery.offset
        )

    def forget(self, tp: TopicPartition) -> None:
        self._committed.pop(tp, None)

    async def rebuild(self, tp: TopicPartition, upto: int) -> None:
        """Fold records [0, upto) of one partition into fresh schedulers."""
        # Announcing: the knobs go on the log again after every (re)build.
        scheduler = PartitionSchedulers(self.policy, announce=True)
        if upto > 0:
            await self._replay(scheduler, tp, upto)
            log.info("rebuilt partition %d from %d records", tp.partition, upto)
        self.schedulers[tp.partition] = scheduler

    async def _replay(self, schedulers: PartitionSchedulers, tp: TopicPartition, upto: int) -> None:
        """Fold the partition's records before ``upto``; no output is written."""
        reader = self.bus.consumer()
        await reader.start()
        try:
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            position = 0
            while position < upto:
                with replaying():
                    polled = await reader.getmany(tp, timeout_ms=1000, max_records=5000)
                for record in polled.get(tp, []):
                    if record.offset >= upto:
                        break
                    try:
                        env = decode(record.value)
                    except DecodeError:
                        continue  # dead-lettered when first consumed
                    step(schedulers.of(env.cluster), env)
                position = await reader.position(tp)
                await asyncio.sleep(0)  # heartbeats, between chunks of a long replay
        finally:
            await reader.stop()


def _count(
    decided: list[tuple[events_pb2.Envelope, list[events_pb2.Envelope]]], now: float
) -> None:
    """Count committed decisions by kind, and how long after its input each was made."""
    for env, outputs in decided:
        for out in outputs:
            DECISIONS.labels(event_type(out)).inc()
        if outputs:
            delay = max(0.0, now - env.occurred_at.ToMicroseconds() / 1e6)
            DECISION_DELAY_SECONDS.labels(event_type(env)).observe(delay)


class Rebalanced(Exception):
    """The group rebalanced while a batch was decided: its transaction must abort."""


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forget the state of partitions that another instance now owns."""

    def __init__(self, service: PlacementService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._service.generation += 1
        for tp in revoked:
            self._service.schedulers.pop(tp.partition, None)
            self._service.forget(tp)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # State is rebuilt lazily, before a partition's first record is decided.
        self._service.generation += 1
        self._service.ready = True
