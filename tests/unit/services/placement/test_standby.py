"""Several placement instances over the in-memory bus: partitions shared by the group,
standbys that take over warm, snapshots that a restart loads, and a zombie fenced."""

from __future__ import annotations

import asyncio
import dataclasses

from aiokafka.partitioner import DefaultPartitioner
from qm.v1 import events_pb2, snapshot_pb2, types_pb2

from libs.bus import load_topic_config
from libs.bus.memory import MemoryBus
from libs.events import new_envelope
from services.placement.service import PlacementService
from tests.placement_gate import GatedPlacement
from tests.unit.services.placement.test_placement_bus import placed, running, write

BASE = load_topic_config()
TOPICS = dataclasses.replace(BASE, events=dataclasses.replace(BASE.events, partitions=4))
EVENTS, DECISIONS = TOPICS.events.name, TOPICS.decisions.name
GROUP = "qm-placement"
# Keyed onto all four partitions (Kafka's default partitioner, murmur2).
CLUSTERS = ("east", "west", "south", "dc-1", "lab-a", "dc-2")


def node(cluster: str) -> events_pb2.Envelope:
    inventory = types_pb2.NodeInventory(
        node_id=f"{cluster}-n0",
        gpus=[types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30) for i in range(64)],
    )
    return new_envelope(
        events_pb2.NodeRegistered(inventory=inventory), producer="test", cluster=cluster
    )


def job(cluster: str, i: int) -> events_pb2.Envelope:
    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"])
    return new_envelope(
        events_pb2.JobAdmitted(job_id=f"{cluster}-j{i}", spec=spec),
        producer="test",
        cluster=cluster,
    )


def jobs(count: int) -> set[str]:
    return {f"{c}-j{i}" for c in CLUSTERS for i in range(count)}


async def until_placed(bus: MemoryBus, expected: set[str]) -> None:
    await bus.until(lambda: set(placed(bus)) == expected)


def service(bus: MemoryBus, name: str, **kwargs: object) -> PlacementService:
    return PlacementService(bus, TOPICS, group_id=GROUP, instance=name, **kwargs)  # type: ignore[arg-type]


async def test_two_instances_share_four_partitions_and_one_takes_over_the_other() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, *(node(c) for c in CLUSTERS), *(job(c, 0) for c in CLUSTERS))
    first, second = service(bus, "a"), service(bus, "b")
    async with running(first):
        async with running(second):
            await until_placed(bus, jobs(1))
            await bus.until(lambda: len(first.owned) == len(second.owned) == 2)
            # Each keeps warm what the other decides, up to the group's committed offsets.
            await write(bus, *(job(c, 1) for c in CLUSTERS))
            await until_placed(bus, jobs(2))
        # The second is gone: the first decides every partition, from warm state.
        await bus.until(lambda: len(first.owned) == 4)
        await write(bus, *(job(c, 2) for c in CLUSTERS))
        await until_placed(bus, jobs(3))
    assert placed(bus) == dict.fromkeys(jobs(3), 1)
    # Jobs of a cluster went to its own node: the taken-over state knew the nodes.
    for env in bus.envelopes(DECISIONS):
        if env.HasField("task_placed"):
            assert env.task_placed.node_id == f"{env.cluster}-n0"


async def test_a_restarted_instance_loads_its_snapshots_instead_of_folding_the_log() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, *(node(c) for c in CLUSTERS), *(job(c, i) for c in CLUSTERS for i in range(3)))
    async with running(service(bus, "a", snapshot_every=2)):
        await until_placed(bus, jobs(3))
    snapshots = [
        snapshot_pb2.PlacementSnapshot.FromString(r.value or b"")
        for r in bus.records(TOPICS.snapshots.name)
    ]
    assert {s.input_partition for s in snapshots} == set(range(4))
    await write(bus, *(job(c, 3) for c in CLUSTERS))
    async with running(restarted := service(bus, "a")):
        await until_placed(bus, jobs(4))
        for partition, owned in restarted.owned.items():
            latest = max(s.next_offset for s in snapshots if s.input_partition == partition)
            assert owned.snapshot_offset == latest > 0  # it started from there
    assert placed(bus) == dict.fromkeys(jobs(4), 1)


async def test_a_zombie_fenced_mid_batch_commits_nothing_and_nothing_is_decided_twice() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node("east"), *(job("east", i) for i in range(6)))
    zombie = GatedPlacement(bus, TOPICS, group_id=GROUP, instance="z", pause_at="east-j3")
    async with running(zombie):
        await asyncio.wait_for(zombie.paused.wait(), 5)
        partition = DefaultPartitioner()(b"east", [0, 1, 2, 3], [0, 1, 2, 3])
        # Another instance starts the partition's producer, as a new owner would.
        intruder = bus.producer(transactional_id=f"{GROUP}-p{partition}")
        await intruder.start()
        zombie.go_on.set()
        await bus.until(lambda: partition not in zombie.owned)  # its commit was refused
        assert placed(bus) == {}
        # Its next poll takes the partition back from the committed offset, fencing in turn.
        await until_placed(bus, {f"east-j{i}" for i in range(6)})
    assert placed(bus) == {f"east-j{i}": 1 for i in range(6)}
