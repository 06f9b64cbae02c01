"""``python -m tests.perf.echo``: the live benchmark's baseline, placement minus the scheduler.

Mirrors ``services/placement/service.py``: the same consumer (group, read_committed),
the same idempotent acks=all transactional producer, one transaction per poll with
the consumed offsets, a span and a log line per output. But for each JobAdmitted it
emits a TaskPlaced at once, on a node picked round-robin, with no scheduling state
(so no rebuild, no digest). The node agents run the echoed tasks as they would real ones.

Settings as placement: ``QM_PLACEMENT_GROUP``, ``QM_ECHO_NODES`` (how many nodes named
``sim-NNNN``), plus the Kafka settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from opentelemetry import trace
from qm.v1 import events_pb2, types_pb2

from libs.bus import (
    Delivery,
    EventConsumer,
    EventProducer,
    KafkaSettings,
    Topics,
    load_topic_config,
)
from libs.events import event_type, new_envelope
from libs.telemetry import setup_tracing
from services.runtime import configure_logging, run_until_signalled

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


def node_name(index: int) -> str:
    return f"sim-{index:04d}"


class Echo:
    def __init__(self, settings: KafkaSettings, topics: Topics, group_id: str, nodes: int) -> None:
        self.settings, self.topics, self.group_id, self.nodes = settings, topics, group_id, nodes
        self.count = 0

    async def run(self) -> None:
        producer = EventProducer(self.settings, client_id="echo", transactional_id=self.group_id)
        deadletters = EventProducer(self.settings, client_id="echo-dlq")
        consumer = EventConsumer(
            self.settings,
            [self.topics.events.name],
            name="echo",
            group_id=self.group_id,
            deadletter_topic=self.topics.deadletter.name,
            deadletter_producer=deadletters,
        )
        await producer.start()
        await deadletters.start()
        await consumer.start()
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
        offsets = {tp: await kafka.position(tp) for tp in kafka.assignment()}
        committed = {tp: await kafka.committed(tp) for tp in offsets}
        if not batch and all(offsets[tp] == (committed[tp] or 0) for tp in offsets):
            return
        async with producer.kafka.transaction():
            acks = []
            for delivery in batch:
                acks.extend(await self._echo(producer, delivery))
            await asyncio.gather(*acks)
            await producer.kafka.send_offsets_to_transaction(offsets, self.group_id)

    async def _echo(self, producer: EventProducer, delivery: Delivery) -> list[Any]:
        env = delivery.envelope
        with tracer.start_as_current_span(
            f"echo {event_type(env)}",
            context=delivery.context,
            attributes={"qm.event_id": env.event_id, "qm.offset": delivery.offset},
        ):
            if event_type(env) != "job_admitted":
                return []
            admitted = env.job_admitted
            node = node_name(self.count % self.nodes)
            self.count += 1
            placed = events_pb2.TaskPlaced(
                job_id=admitted.job_id,
                task_id=f"{admitted.job_id}/0",
                node_id=node,
                gpu_indices=list(range(admitted.spec.gpus)),
                spec=admitted.spec,
                provenance=types_pb2.Provenance(
                    input_partition=delivery.partition,
                    input_offset=delivery.offset,
                    policy="echo",
                    policy_version=1,
                ),
            )
            out = new_envelope(
                placed,
                producer="placement",
                cluster=env.cluster,
                correlation_id=admitted.job_id,
                causation_id=env.event_id,
                occurred=env.occurred_at.ToDatetime(),
                event_id=f"{env.cluster}-p{delivery.partition}-o{delivery.offset}-d0",
            )
            log.info("%s %s", event_type(out), out.correlation_id)
            ack = await producer.enqueue(self.topics.decisions.name, out, key=out.cluster)
            return [ack]


def main() -> None:
    configure_logging("echo")
    setup_tracing("echo")
    echo = Echo(
        KafkaSettings.from_env(),
        load_topic_config(),
        os.environ.get("QM_PLACEMENT_GROUP", "qm-echo"),
        int(os.environ.get("QM_ECHO_NODES", "1")),
    )
    asyncio.run(run_until_signalled(echo.run()))


if __name__ == "__main__":
    main()
