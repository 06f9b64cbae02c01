"""A consumer's lag, measured after its polls, partition by partition, over the memory bus."""

from __future__ import annotations

import time

from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY

from libs.bus.lag import LagMeter
from libs.bus.memory import MemoryBus

P0, P1 = TopicPartition("qm.test-lag-a", 0), TopicPartition("qm.test-lag-b", 0)


def shown(name: str, tp: TopicPartition) -> float | None:
    labels = {"consumer": name, "topic": tp.topic, "partition": str(tp.partition)}
    return REGISTRY.get_sample_value("qm_consumer_lag_records", labels)


async def write(bus: MemoryBus, tp: TopicPartition, count: int) -> None:
    producer = bus.producer()
    for i in range(count):
        await producer.send(tp.topic, f"r{i}".encode())


async def test_lag_is_what_is_left_to_read_and_goes_with_the_partition() -> None:
    bus = MemoryBus()
    await write(bus, P0, 5)
    await write(bus, P1, 2)
    consumer = bus.consumer()
    await consumer.start()
    consumer.assign([P0, P1])
    meter = LagMeter(consumer, "lag-test", every_s=0)
    before = time.time()
    await meter.polled()
    assert (shown("lag-test", P0), shown("lag-test", P1)) == (5, 2)
    last_poll = REGISTRY.get_sample_value(
        "qm_consumer_last_poll_timestamp_seconds", {"consumer": "lag-test"}
    )
    assert last_poll is not None and before <= last_poll <= time.time()
    await consumer.getmany(P0, max_records=3)
    await meter.polled()
    assert (shown("lag-test", P0), shown("lag-test", P1)) == (2, 2)
    consumer.assign([P1])  # P0 is another consumer's now: its lag is no longer ours to show
    await consumer.getmany(P1)
    await meter.polled()
    assert (shown("lag-test", P0), shown("lag-test", P1)) == (None, 0)
