"""The bus contract: what the services rely on of a bus, as cases that run against the
in-memory bus (on which the services' unit tests stand) and against the real broker
alike, so that a unit test passing on ``MemoryBus`` means what it would on Kafka.

Ordering per key, transactions and their aborts, fencing, committed offsets and
redelivery, a group's rebalances, and records over the size limit."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka import ConsumerRebalanceListener
from aiokafka.admin import NewTopic
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition

from libs.bus import KafkaBus, KafkaSettings
from libs.bus.memory import MemoryBus
from libs.bus.ports import Bus, Consumer, Record

WAIT_S = 60.0  # a group's rebalance on the broker takes seconds


@dataclass
class Under:
    """A bus under test, and the topics made for one case."""

    bus: Bus
    make: Callable[[str, int], asyncio.Future[None] | None]
    made: list[str] = field(default_factory=list)

    async def topic(self, partitions: int) -> str:
        name = f"contract-{uuid.uuid4().hex[:10]}"
        made = self.make(name, partitions)
        if made is not None:
            await made
        self.made.append(name)
        return name


@pytest.fixture(params=["memory", "kafka"])
async def under(request: pytest.FixtureRequest) -> AsyncIterator[Under]:
    if request.param == "memory":
        memory = MemoryBus({})
        yield Under(memory, lambda name, n: memory.create_topic(name, n))
        return
    kafka = KafkaBus(KafkaSettings.from_env())
    admin = kafka.admin()
    await admin.start()

    def create(name: str, partitions: int) -> asyncio.Future[None]:
        return asyncio.ensure_future(_create(admin, name, partitions))

    case = Under(kafka, create)
    try:
        yield case
    finally:
        if case.made:
            await admin.delete_topics(case.made)
        await admin.close()


async def _create(admin: object, name: str, partitions: int) -> None:
    await admin.create_topics([NewTopic(name, partitions, 1)])  # type: ignore[attr-defined]


async def read(consumer: Consumer, count: int) -> list[Record]:
    """Poll until ``count`` records came (or WAIT_S passed), in the order polled."""
    got: list[Record] = []
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        polled = await consumer.getmany(timeout_ms=200)
        for tp in sorted(polled):
            got += polled[tp]
    return got


async def settle(condition: Callable[[], bool], *consumers: Consumer) -> None:
    """Poll ``consumers`` (a group rebalances as its members poll) until ``condition``."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the group never settled"
        for consumer in consumers:
            await consumer.getmany(timeout_ms=100)


async def sent(under: Under, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
    producer = under.bus.producer()
    await producer.start()
    try:
        for written in [await producer.send(topic, value, key) for key, value in items]:
            await written
    finally:
        await producer.stop()


async def reader(under: Under, topic: str, partitions: int) -> Consumer:
    consumer = under.bus.consumer()
    await consumer.start()
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    return consumer


async def test_a_keys_records_keep_their_order_on_the_partition_kafka_picks(under: Under) -> None:
    topic = await under.topic(4)
    keys = [b"east", b"west", b"north", b"south"]
    await sent(under, topic, [(k, k + b"-%d" % i) for i in range(5) for k in keys])
    consumer = await reader(under, topic, 4)
    try:
        records = await read(consumer, 20)
    finally:
        await consumer.stop()
    everyone = [0, 1, 2, 3]
    for key in keys:
        mine = [r for r in records if r.key == key]
        assert {r.partition for r in mine} == {DefaultPartitioner()(key, everyone, everyone)}
        assert [r.value for r in mine] == [key + b"-%d" % i for i in range(5)]


async def test_a_transactions_records_are_read_once_it_commits_never_if_it_aborts(
    under: Under,
) -> None:
    topic, inputs = await under.topic(1), await under.topic(1)
    tp, input_tp = TopicPartition(topic, 0), TopicPartition(inputs, 0)
    producer = under.bus.producer(transactional_id=f"contract-{uuid.uuid4().hex[:8]}")
    await producer.start()
    consumer = await reader(under, topic, 1)
    try:
        async with producer.transaction():
            await (await producer.send(topic, b"committed", b"k"))
            await producer.send_offsets_to_transaction({input_tp: 7}, "contract-group")
            assert await consumer.getmany(timeout_ms=200) == {}  # not yet committed
        with pytest.raises(RuntimeError):
            async with producer.transaction():
                await (await producer.send(topic, b"aborted", b"k"))
                raise RuntimeError
        await sent(under, topic, [(b"k", b"after")])
        records = await read(consumer, 2)
        assert [r.value for r in records] == [b"committed", b"after"]
        assert await consumer.position(tp) > records[-1].offset  # past the aborted one
        group = under.bus.consumer(group_id="contract-group")
        await group.start()
        try:
            assert await group.committed(input_tp) == 7
        finally:
            await group.stop()
    finally:
        await consumer.stop()
        await producer.stop()


async def test_a_transactional_id_fences_the_producer_that_had_it(under: Under) -> None:
    topic = await under.topic(1)
    transactional_id = f"contract-{uuid.uuid4().hex[:8]}"
    zombie = under.bus.producer(transactional_id=transactional_id)
    heir = under.bus.producer(transactional_id=transactional_id)
    await zombie.start()
    try:
        with pytest.raises(ProducerFenced):
            async with zombie.transaction():
                await (await zombie.send(topic, b"zombie's", b"k"))
                await heir.start()  # ends the zombie's open transaction, and the zombie
        async with heir.transaction():
            await (await heir.send(topic, b"heir's", b"k"))
        consumer = await reader(under, topic, 1)
        try:
            assert [r.value for r in await read(consumer, 1)] == [b"heir's"]
            assert await consumer.getmany(timeout_ms=500) == {}
        finally:
            await consumer.stop()
    finally:
        await zombie.stop()
        await heir.stop()


async def test_a_group_resumes_from_its_committed_offset_and_gets_the_rest_again(
    under: Under,
) -> None:
    topic = await under.topic(1)
    tp = TopicPartition(topic, 0)
    await sent(under, topic, [(b"k", b"%d" % i) for i in range(3)])
    group = f"contract-{uuid.uuid4().hex[:8]}"
    first = under.bus.consumer(group_id=group)
    await first.start()
    first.subscribe([topic])
    assert [r.value for r in await read(first, 3)] == [b"0", b"1", b"2"]
    await first.commit({tp: 2})  # acted on two: the third is delivered again
    await first.stop()
    again = under.bus.consumer(group_id=group)
    await again.start()
    try:
        again.subscribe([topic])
        assert [r.value for r in await read(again, 1)] == [b"2"]
        assert await again.committed(tp) == 2
    finally:
        await again.stop()
    latest = under.bus.consumer(group_id=f"{group}-new", auto_offset_reset="latest")
    await latest.start()
    try:
        latest.subscribe([topic])
        await settle(lambda: bool(latest.assignment()), latest)
        assert await latest.getmany(timeout_ms=500) == {}
        assert await latest.position(tp) == 3
    finally:
        await latest.stop()


async def test_a_group_shares_its_partitions_and_takes_back_a_leavers(under: Under) -> None:
    topic = await under.topic(2)
    both = {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    group = f"contract-{uuid.uuid4().hex[:8]}"
    first, second = under.bus.consumer(group_id=group), under.bus.consumer(group_id=group)
    told = Listener()
    await first.start()
    await second.start()
    try:
        first.subscribe([topic], listener=told)
        await settle(lambda: first.assignment() == both, first)
        second.subscribe([topic])
        await settle(
            lambda: (
                len(first.assignment()) == len(second.assignment()) == 1
                and first.assignment() | second.assignment() == both
            ),
            first,
            second,
        )
        await second.stop()
        await settle(lambda: first.assignment() == both, first)
        # Told of each move: both, then its share, then both again once the other left.
        assigned = [parts for call, parts in told.calls if call == "assigned" and parts]
        assert assigned[0] == both and len(assigned[1]) == 1 and assigned[-1] == both
    finally:
        await first.stop()
        await second.stop()


async def test_a_record_over_the_size_limit_is_refused_when_sent(under: Under) -> None:
    topic = await under.topic(1)
    producer = under.bus.producer()
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send(topic, b"x" * (2 << 20), b"k")
        await (await producer.send(topic, b"x" * (512 << 10), b"k"))  # under it: written
    finally:
        await producer.stop()


class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka wants its own
    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition]]] = []

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.calls.append(("revoked", set(revoked)))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.calls.append(("assigned", set(assigned)))
