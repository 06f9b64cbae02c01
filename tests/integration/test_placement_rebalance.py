"""Placement in-process on the real broker: a rebalance in the middle of a batch.

A member that joins the group while placement decides a batch takes partitions
from it; the batch's transaction must abort, so that no decision is committed
twice when the records are decided again by whoever owns them next.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import yaml
from qm.v1 import events_pb2, types_pb2

from libs.bus import (
    EventProducer,
    KafkaBus,
    KafkaSettings,
    ensure_topics,
    load_topic_config,
)
from libs.events import decode, new_envelope
from tests.integration.conftest import committed_records
from tests.integration.stack import ROOT
from tests.placement_gate import GatedPlacement

JOBS = 40


async def test_a_batch_decided_across_a_rebalance_is_not_committed_twice(
    tmp_path: Path,
) -> None:
    settings = KafkaSettings.from_env()
    bus = KafkaBus(settings)
    topics = load_topic_config(private_topics(tmp_path, f"r{uuid.uuid4().hex[:8]}"))
    await ensure_topics(settings, topics)
    async with EventProducer(bus, client_id="test") as producer:
        for env in inputs():
            await producer.send(topics.events.name, env)

    group = f"rebalance-{uuid.uuid4().hex[:8]}"
    service = GatedPlacement(bus, topics, group_id=group, pause_at="j-20")
    running = asyncio.create_task(service.run())
    intruder = bus.consumer(group_id=group)
    try:
        async with asyncio.timeout(60):
            await service.paused.wait()
            await intruder.start()
            intruder.subscribe([topics.events.name])  # joins the group: partitions move
            while not intruder.assignment():
                await intruder.getmany(timeout_ms=100)
            service.go_on.set()
            await asyncio.sleep(1)
            await intruder.stop()  # and come back to placement, which decides them again
            placed = await until_every_job_placed(settings, topics.decisions.name)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert sorted(placed) == sorted(f"j-{i}" for i in range(JOBS))
    assert [job for job, count in placed.items() if count > 1] == []


def private_topics(tmp_path: Path, prefix: str) -> Path:
    config = yaml.safe_load((ROOT / "deploy" / "topics.yaml").read_text())
    for topic in config["topics"].values():
        topic["name"] = f"{prefix}.{topic['name']}"
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def inputs() -> list[events_pb2.Envelope]:
    node = types_pb2.NodeInventory(
        node_id="n0",
        gpus=[types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30) for i in range(64)],
    )
    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"])
    return [
        new_envelope(events_pb2.NodeRegistered(inventory=node), producer="test"),
        *(
            new_envelope(events_pb2.JobAdmitted(job_id=f"j-{i}", spec=spec), producer="test")
            for i in range(JOBS)
        ),
    ]


async def until_every_job_placed(settings: KafkaSettings, topic: str) -> Counter[str]:
    """TaskPlaced decisions per job, as committed, once every job has one."""
    while True:
        placed = Counter(
            env.task_placed.job_id
            for env in await committed(settings, topic)
            if env.HasField("task_placed")
        )
        if len(placed) == JOBS:
            await asyncio.sleep(1)  # and a moment more, for any duplicate on its way
            return Counter(
                env.task_placed.job_id
                for env in await committed(settings, topic)
                if env.HasField("task_placed")
            )
        await asyncio.sleep(0.5)


async def committed(settings: KafkaSettings, topic: str) -> list[events_pb2.Envelope]:
    return [decode(record.value) for record in await committed_records(settings, topic)]
