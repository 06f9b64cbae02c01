"""The audit on the real broker: against placement's snapshots (a replay from the start
vouches for each partition's latest snapshot; a replay from the snapshots checks only
the decisions after them, and reproduces them too), and in parallel (worker processes,
a share of the input partitions each: the serial verdict, divergence included)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from qm.v1 import events_pb2

from libs.audit import audit_topics, kafka_source
from libs.bus import EventProducer, KafkaBus, KafkaSettings, ensure_topics, load_topic_config
from services.placement.service import PlacementService
from tests.integration.test_placement_rebalance import (
    JOBS,
    committed,
    inputs,
    private_topics,
    until_every_job_placed,
)
from tests.unit.services.placement.test_standby import CLUSTERS, job, node


async def placed_jobs(settings: KafkaSettings, topic: str) -> Counter[str]:
    return Counter(
        env.task_placed.job_id
        for env in await committed(settings, topic)
        if env.HasField("task_placed")
    )


async def test_an_audit_checks_placements_snapshots_and_can_start_from_them(
    tmp_path: Path,
) -> None:
    settings = KafkaSettings.from_env()
    bus = KafkaBus(settings)
    topics = load_topic_config(private_topics(tmp_path, f"s{uuid.uuid4().hex[:8]}"))
    await ensure_topics(settings, topics)
    async with EventProducer(bus, client_id="test") as producer:
        for env in inputs():
            await producer.send(topics.events.name, env)
    group = f"qm-placement-snap-{uuid.uuid4().hex[:8]}"
    service = PlacementService(bus, topics, group_id=group, snapshot_every=10)
    running = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            await until_every_job_placed(settings, topics.decisions.name)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    full = await audit_topics(settings, topics, group=group)
    assert full.ok and full.inputs == JOBS + 1
    [check] = full.snapshots
    assert check.ok and 10 <= check.offset <= JOBS + 1

    tail = await audit_topics(settings, topics, group=group, from_snapshots=True)
    assert tail.ok and tail.started_from == ((check.partition, check.offset),)
    assert tail.inputs == JOBS + 1 - check.offset
    assert tail.checked == tail.reproduced < full.checked


async def test_a_parallel_audit_gives_the_serial_verdict_and_finds_a_forgery_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = KafkaSettings.from_env()
    bus = KafkaBus(settings)
    path = private_topics(tmp_path, f"p{uuid.uuid4().hex[:8]}")
    config = yaml.safe_load(path.read_text())
    config["partitions"] = 4
    path.write_text(yaml.safe_dump(config))
    topics = load_topic_config(path)
    await ensure_topics(settings, topics)
    async with EventProducer(bus, client_id="test") as producer:
        for cluster in CLUSTERS:
            await producer.send(topics.events.name, node(cluster))
            for i in range(5):
                await producer.send(topics.events.name, job(cluster, i))
    group = f"qm-placement-par-{uuid.uuid4().hex[:8]}"
    running = asyncio.create_task(PlacementService(bus, topics, group_id=group).run())
    try:
        async with asyncio.timeout(60):
            while len(await placed_jobs(settings, topics.decisions.name)) < 5 * len(CLUSTERS):
                await asyncio.sleep(0.5)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    monkeypatch.setattr(kafka_source, "PARALLEL_FROM", 0)  # worth workers however short

    serial = await audit_topics(settings, topics, group=group)
    parallel = await audit_topics(settings, topics, group=group, workers=3)
    assert serial.ok and parallel == serial

    # A forged placement of the last partition's first job: the audit names it.
    decisions = await committed(settings, topics.decisions.name)
    real = next(
        env
        for env in decisions
        if env.HasField("task_placed") and env.task_placed.provenance.input_partition == 3
    )
    forged = events_pb2.Envelope()
    forged.CopyFrom(real)
    forged.task_placed.node_id = "elsewhere"
    async with EventProducer(bus, client_id="forger") as producer:
        await producer.send(topics.decisions.name, forged)
    serial = await audit_topics(settings, topics, group=group)
    parallel = await audit_topics(settings, topics, group=group, workers=3)
    assert serial.divergence is not None and serial.divergence.partition == 3
    assert parallel.divergence == serial.divergence and not parallel.ok
