"""The placement loop: consume the event log, decide, emit, all in one transaction.

Each poll's decisions and the consumer offsets that produced them are
committed in one Kafka transaction, so a crash never loses or doubles a
decision. Before the first record of a newly assigned partition is decided,
the scheduler state for that partition is rebuilt by replaying the log up to
that record (outputs suppressed): the state is a pure function of the log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from qm.v1 import events_pb2

from libs.bus import Delivery, EventConsumer, EventProducer, KafkaSettings, Topics
from libs.core import PolicyConfig
from libs.events import DecodeError, decode, event_type
from libs.events.decide import PartitionSchedulers

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass
class PlacementService:
    settings: KafkaSettings
    topics: Topics
    # Also the transactional id: a restarted (or standby) instance fences the old one.
    group_id: str = "qm-placement"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # What this instance last committed, so an idle poll costs no broker round trip.
    _committed: dict[TopicPartition, int] = field(default_factory=dict)
    schedulers: dict[int, PartitionSchedulers] = field(default_factory=dict)

    async def run(self) -> None:
        producer = EventProducer(
            self.settings, client_id="placement", transactional_id=self.group_id
        )
        deadletters = EventProducer(self.settings, client_id="placement-dlq")
        consumer = EventConsumer(
            self.settings,
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
                if not consumer.kafka.assignment():
                    continue
                await self._commit(producer, consumer, batch)
        finally:
            await consumer.stop()
            await producer.stop()
            await deadletters.stop()

    async def _commit(
        self, producer: EventProducer, consumer: EventConsumer, batch: list[Delivery]
    ) -> None:
        kafka = consumer.kafka
        for delivery in batch:
            if delivery.partition not in self.schedulers:
                await self.rebuild(delivery.topic_partition, delivery.offset)
        # The positions cover dead-lettered records too, so those are not re-read.
        offsets = {tp: await kafka.position(tp) for tp in kafka.assignment()}
        if not batch and all(self._committed.get(tp) == offset for tp, offset in offsets.items()):
            return
        async with producer.kafka.transaction():
            acks = []
            for delivery in batch:
                acks.extend(await self._decide(producer, delivery))
            await asyncio.gather(*acks)
            await producer.kafka.send_offsets_to_transaction(offsets, self.group_id)
        self._committed.update(offsets)

    async def _decide(self, producer: EventProducer, delivery: Delivery) -> list[Any]:
        """Decide one record and queue its outputs inside its span, so they carry its trace."""
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
            acks = []
            for out in self.outputs(delivery):
                log.info("%s %s", event_type(out), out.correlation_id)
                acks.append(
                    await producer.enqueue(self.topics.decisions.name, out, key=out.cluster)
                )
            return acks

    def outputs(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        """The decisions one input record causes."""
        return self.schedulers[delivery.partition].decide(
            delivery.envelope, partition=delivery.partition, offset=delivery.offset
        )

    def forget(self, tp: TopicPartition) -> None:
        self._committed.pop(tp, None)

    async def rebuild(self, tp: TopicPartition, upto: int) -> None:
        """Fold records [0, upto) of one partition into fresh schedulers."""
        scheduler = PartitionSchedulers(self.policy)
        if upto > 0:
            await self._replay(scheduler, tp, upto)
            log.info("rebuilt partition %d from %d records", tp.partition, upto)
        self.schedulers[tp.partition] = scheduler

    async def _replay(self, schedulers: PartitionSchedulers, tp: TopicPartition, upto: int) -> None:
        reader = AIOKafkaConsumer(
            **self.settings.client_kwargs(),
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await reader.start()
        try:
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            position = 0
            while position < upto:
                polled = await reader.getmany(tp, timeout_ms=1000, max_records=5000)
                for record in polled.get(tp, []):
                    if record.offset >= upto:
                        break
                    try:
                        env = decode(record.value)
                    except DecodeError:
                        continue  # dead-lettered when first consumed
                    schedulers.decide(env, partition=tp.partition, offset=record.offset)
                position = await reader.position(tp)
        finally:
            await reader.stop()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forget the state of partitions that another instance now owns."""

    def __init__(self, service: PlacementService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._service.schedulers.pop(tp.partition, None)
            self._service.forget(tp)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass  # state is rebuilt lazily, before a partition's first record is decided
