"""Restart: placement killed after ``events`` inputs, started again, from its snapshots
and (the baseline, same run) from the log alone.

Fresh topics; one cluster of 100 nodes × 8 GPUs filled by 100 jobs that never end, then
``events`` inputs of a busy log: per ten, a job admitted (it waits) and cancelled, and
eight clock ticks. A placement instance decides them all (snapshotting every 50,000
inputs, its default), is killed (-9), and a probe job is written; a new instance starts
and the time from its start to the probe's decision is ``restart.seconds``. Then that
instance is killed, another probe written, and an instance whose snapshot topic is an
empty one starts: it folds the whole log, ``restart.cold_seconds``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventProducer, KafkaBus, load_topic_config
from libs.events import DecodeError, decode, new_envelope
from tests.integration.stack import Stack
from tests.perf.live_bench import broker
from tests.perf.options import option
from tests.perf.ranges import Figure
from tests.perf.stats import console, fmt, table
from tests.signed_log import Signers, sign

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES, GPUS = 100, 8


@dataclass(frozen=True)
class RestartParams:
    events: int = option(250_000, "inputs placement decides before it is killed")
    bootstrap: str = "127.0.0.1:19092"


@dataclass(frozen=True)
class RestartResult:
    events: int
    first_s: float  # the first instance deciding every input as it came
    seconds: float
    cold_seconds: float


def _envelopes(count: int) -> list[events_pb2.Envelope]:
    """The log: nodes, jobs that fill them, then ``count`` inputs of churn and ticks."""
    at = iter(T0 + timedelta(seconds=i * 0.1) for i in range(NODES * 2 + count + 10))
    log = []
    for n in range(NODES):
        inventory = types_pb2.NodeInventory(
            node_id=f"n{n:03d}",
            gpus=[types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30) for i in range(GPUS)],
        )
        log.append(
            new_envelope(
                events_pb2.NodeRegistered(inventory=inventory), producer="bench", occurred=next(at)
            )
        )
    for n in range(NODES):
        log.append(_job(f"fill-{n}", GPUS, next(at)))
    for i in range(count):
        if i % 10 == 0:
            log.append(_job(f"w-{i}", 1, next(at)))
        elif i % 10 == 1:
            cancel = events_pb2.JobCancelRequested(job_id=f"w-{i - 1}", requested_by="u")
            log.append(new_envelope(cancel, producer="bench", occurred=next(at)))
        else:
            log.append(new_envelope(events_pb2.ClockTick(), producer="bench", occurred=next(at)))
    return log


def _job(job_id: str, gpus: int, at: datetime) -> events_pb2.Envelope:
    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=gpus, command=["true"])
    admitted = events_pb2.JobAdmitted(job_id=job_id, spec=spec)
    return new_envelope(admitted, producer="bench", occurred=at)


async def _write(stack: Stack, envs: list[events_pb2.Envelope]) -> None:
    """The log, as its writers sign it (placement refuses what they did not)."""
    topics = load_topic_config(stack.topics_file)
    sealed = sign(envs, Signers(stack.trust_file.parent))
    async with EventProducer(KafkaBus(stack.kafka_settings()), client_id="restart") as producer:
        pending = [await producer.enqueue(topics.events.name, env) for env in sealed]
        await asyncio.gather(*pending)


async def _committed_all(stack: Stack) -> None:
    """Wait until placement's group has committed the whole events topic."""
    topics = load_topic_config(stack.topics_file)
    group = stack.env["QM_PLACEMENT_GROUP"]
    consumer = KafkaBus(stack.kafka_settings()).consumer(group_id=group)
    await consumer.start()
    try:
        tps = [TopicPartition(topics.events.name, p) for p in range(topics.events.partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            while (await consumer.committed(tp) or 0) < ends[tp]:
                await asyncio.sleep(0.5)
    finally:
        await consumer.stop()


async def _decided(stack: Stack, job_id: str) -> None:
    """Wait until a decision about ``job_id`` is committed."""
    topics = load_topic_config(stack.topics_file)
    consumer = KafkaBus(stack.kafka_settings()).consumer(fetch_max_wait_ms=50)
    await consumer.start()
    consumer.subscribe([topics.decisions.name])
    try:
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    try:
                        if decode(record.value).correlation_id == job_id:
                            return
                    except DecodeError:
                        continue
    finally:
        await consumer.stop()


def _restart(stack: Stack, key: str, probe: str, env: dict[str, str]) -> float:
    """Write a probe job, start an instance, and time its start to the probe's decision."""
    asyncio.run(_write(stack, [_job(probe, 1, datetime.now(UTC))]))
    started = time.monotonic()
    stack.start_instance(key, "placement", {"QM_PLACEMENT_INSTANCE": key, **env})
    asyncio.run(_decided(stack, probe))
    return time.monotonic() - started


def scenario(workdir: Path, params: RestartParams) -> RestartResult:
    stack = Stack(workdir, bootstrap=params.bootstrap)
    # The cold instance reads another, empty, snapshot topic: all else is the same.
    config = yaml.safe_load(stack.topics_file.read_text())
    config["topics"]["snapshots"]["name"] += "-empty"
    cold_topics = workdir / "topics-cold.yaml"
    cold_topics.write_text(yaml.safe_dump(config))
    stack.create_topics()
    stack.create_topics(cold_topics)
    try:
        asyncio.run(_write(stack, _envelopes(params.events)))
        started = time.monotonic()
        stack.start_instance("first", "placement", {"QM_PLACEMENT_INSTANCE": "first"})
        asyncio.run(_committed_all(stack))
        first_s = time.monotonic() - started
        stack.kill("first")
        warm = _restart(stack, "warm", "probe-warm", {})
        stack.kill("warm")
        cold = _restart(stack, "cold", "probe-cold", {"QM_TOPICS": str(cold_topics)})
    finally:
        stack.down()
    return RestartResult(params.events, first_s, warm, cold)


def run_restart(params: RestartParams) -> list[Figure]:
    with broker(params.bootstrap), tempfile.TemporaryDirectory() as workdir:
        result = scenario(Path(workdir), params)
    table(
        f"restart: placement killed after {result.events:,} inputs "
        f"(decided live in {fmt(result.first_s)} s), started again; target: seconds",
        ["start from", "start → first decision, s"],
        [
            ["its snapshots (and the log after them)", fmt(result.seconds)],
            ["the log alone (baseline)", fmt(result.cold_seconds)],
        ],
    )
    console.print(f"restart: {fmt(result.cold_seconds / result.seconds)}× faster from snapshots")
    return [
        Figure("restart.seconds", result.seconds, "s"),
        Figure("restart.cold_seconds", result.cold_seconds, "s"),
        Figure("restart.speedup", result.cold_seconds / result.seconds, "×"),
    ]
