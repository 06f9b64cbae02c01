"""What the in-memory bus adds for tests: keyless round-robin, the listener's exact calls,
a subscriber without a group, a bus that is down. What it shares with Kafka (ordering per
key, transactions, fencing, committed offsets) is the bus contract,
``tests/integration/test_bus_contract.py``, run against both."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import IllegalOperation, IllegalStateError
from aiokafka.structs import TopicPartition

from libs.bus.memory import MemoryBus, MemoryRecord

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition]]] = []

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.calls.append(("revoked", revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.calls.append(("assigned", assigned))


async def send(bus: MemoryBus, key: bytes | None, value: bytes, topic: str = "t") -> int:
    producer = bus.producer()
    return int((await (await producer.send(topic, value, key, headers=[("h", b"1")]))).offset)


async def test_offsets_count_per_partition_and_records_keep_their_headers() -> None:
    bus = MemoryBus({"t": 2})
    offsets = [await send(bus, b"k", str(i).encode()) for i in range(3)]
    assert offsets == [0, 1, 2]
    [first, *_] = bus.records("t")
    assert first.headers == (("h", b"1"),) and first.value == b"0"
    await send(bus, None, b"a")
    await send(bus, None, b"b")
    assert [r.partition for r in bus.records("t") if r.key is None] == [0, 1]  # round-robin


async def test_a_group_shares_partitions_and_tells_its_members_when_they_move() -> None:
    bus = MemoryBus({"t": 2})
    first, second = bus.consumer(group_id="g"), bus.consumer(group_id="g")
    told = Listener()
    await first.start()
    first.subscribe(["t"], listener=told)
    await first.getmany(timeout_ms=0)
    assert first.assignment() == {T0, T1}
    await second.start()
    second.subscribe(["t"])
    await second.getmany(timeout_ms=0)
    assert (first.assignment(), second.assignment()) == ({T0}, {T1})
    await second.stop()
    assert first.assignment() == {T0, T1}
    assert told.calls == [
        ("revoked", set()),
        ("assigned", {T0, T1}),
        ("revoked", {T0, T1}),
        ("assigned", {T0}),
        ("revoked", {T0}),
        ("assigned", {T0, T1}),
    ]


async def test_without_a_group_a_subscriber_reads_every_partition_and_cannot_commit() -> None:
    bus = MemoryBus({"t": 2})
    await send(bus, None, b"e")  # keyless: round-robin, one on each partition
    await send(bus, None, b"w")
    reader = bus.consumer()
    await reader.start()
    reader.subscribe(["t"])
    polled = await reader.getmany(timeout_ms=0)
    assert reader.assignment() == {T0, T1}
    assert sorted(r.value or b"" for records in polled.values() for r in records) == [b"e", b"w"]
    assert await reader.topics() == {"t"}
    reader.seek(T0, 0)
    await reader.seek_to_beginning(T1)
    assert await reader.getmany(T1, timeout_ms=0, max_records=1) == {T1: [bus.records("t")[1]]}
    assert (await reader.getmany(timeout_ms=0))[T0][0].value == b"e"
    with pytest.raises(IllegalOperation):
        await reader.commit({T0: 1})
    with pytest.raises(IllegalStateError):
        await reader.position(TopicPartition("t", 5))


async def test_a_waiting_poll_wakes_when_a_record_arrives_and_the_bus_can_be_down() -> None:
    bus = MemoryBus()
    reader = bus.consumer()
    reader.assign([T0])
    task = asyncio.ensure_future(reader.getmany(timeout_ms=5000))
    await asyncio.sleep(0)
    await send(bus, b"k", b"v")
    assert (await asyncio.wait_for(task, 1))[T0] == [
        MemoryRecord("t", 0, 0, b"k", b"v", (("h", b"1"),))
    ]
    bus.down = True
    written = await bus.producer().send("t", b"lost", b"k")
    await asyncio.sleep(0.01)
    assert not written.done() and len(bus.records("t")) == 1
