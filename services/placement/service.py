"""The placement loop: consume the event log, decide, emit, all in one transaction.

Each poll's decisions and the consumer offsets that produced them are
committed in one Kafka transaction, so a crash never loses or doubles a
decision. On partition assignment the scheduler state for that partition is
rebuilt by replaying the log up to the committed offset (outputs suppressed):
the state is a pure function of the log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from qm.v1 import events_pb2

from libs.bus import Delivery, EventConsumer, EventProducer, KafkaSettings, Topics
from libs.core import Scheduler
from libs.events import DecodeError, decode, event_type
from libs.events.decide import decide

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

GROUP_ID = "qm-placement"


@dataclass
class PlacementService:
    settings: KafkaSettings
    topics: Topics
    transactional_id: str = "qm-placement"
    schedulers: dict[int, Scheduler] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        producer = EventProducer(
            self.settings, client_id="placement", transactional_id=self.transactional_id
        )
        deadletters = EventProducer(self.settings, client_id="placement-dlq")
        consumer = EventConsumer(
            self.settings,
            [self.topics.events.name],
            name="placement",
            group_id=GROUP_ID,
            deadletter_topic=self.topics.deadletter.name,
            deadletter_producer=deadletters,
        )
        await producer.start()
        await deadletters.start()
        await consumer.start(listener=_Rebuild(self, consumer.kafka))
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
        # The positions cover dead-lettered records too, so those are not re-read.
        offsets = {tp: await kafka.position(tp) for tp in kafka.assignment()}
        committed = {tp: await kafka.committed(tp) for tp in offsets}
        if not batch and all(offsets[tp] == (committed[tp] or 0) for tp in offsets):
            return
        async with producer.kafka.transaction():
            acks = []
            for delivery in batch:
                for out in self._step(delivery):
                    acks.append(
                        await producer.enqueue(self.topics.decisions.name, out, key=out.cluster)
                    )
            await asyncio.gather(*acks)
            await producer.kafka.send_offsets_to_transaction(offsets, GROUP_ID)

    def _step(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        scheduler = self.schedulers.setdefault(delivery.partition, Scheduler())
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
            outputs = decide(scheduler, env, partition=delivery.partition, offset=delivery.offset)
            for out in outputs:
                log.info("%s %s", event_type(out), out.correlation_id)
            return outputs

    async def rebuild(self, tp: TopicPartition, upto: int) -> None:
        """Fold records [0, upto) of one partition into a fresh scheduler."""
        scheduler = Scheduler()
        self.schedulers[tp.partition] = scheduler
        if upto <= 0:
            return
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
                    decide(scheduler, env, partition=tp.partition, offset=record.offset)
                position = await reader.position(tp)
        finally:
            await reader.stop()
        log.info("rebuilt partition %d from %d records", tp.partition, upto)


class _Rebuild(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: PlacementService, consumer: AIOKafkaConsumer) -> None:
        self._service = service
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._service.schedulers.pop(tp.partition, None)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in sorted(assigned):
            committed = await self._consumer.committed(tp) or 0
            await self._service.rebuild(tp, committed)
        self._service.ready.set()
