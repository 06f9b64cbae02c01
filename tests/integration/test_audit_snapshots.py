"""The audit against placement's snapshots on the real broker: a replay from the start
vouches for each partition's latest snapshot; a replay from the snapshots checks only
the decisions after them, and reproduces them too."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

from libs.audit import audit_topics
from libs.bus import EventProducer, KafkaBus, KafkaSettings, ensure_topics, load_topic_config
from services.placement.service import PlacementService
from tests.integration.test_placement_rebalance import (
    JOBS,
    committed,
    inputs,
    private_topics,
    until_every_job_placed,
)


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
