"""Audit: ``qm audit verify``'s replay over a log on the broker, events per second.

The log: ``partitions`` input partitions, each a simulated cluster of the golden
recorder (``tests/golden/record.py``: batch jobs arriving every 150 s on average, about
half the nodes' capacity, a steady state (faster arrivals grow the queue without end,
and the core's cost per event with it, so that the core is all one measures); with
their starts, ends, preemptions and the decisions placement made of them), ``jobs``
jobs each, written to fresh topics as placement would have: inputs at their offsets,
decisions keyed by cluster. The logs are made once and kept in .local/bench (the
simulator takes a minute); the topics are fresh per run.

Every input is signed by its writer, each node approved before its first report
(``tests/signed_log.py``), and the decisions are those placement makes behind the gate.

``audit.events_per_s`` counts what the audit reads and checks: input records replayed
plus recorded decisions compared, over the wall time of ``audit_topics`` (the command's
own work, without its start), with ``workers`` processes (``qm audit verify``'s default:
one per core, at most one per partition), each checking its inputs' signatures with the
trust file as placement does. The baselines, same run: the same replay without checking
them (``audit.unchecked_events_per_s``: what checking costs is ``audit.vs_unchecked``),
and reading and decoding the same records without replaying them
(``audit.read_events_per_s``).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aiokafka.structs import TopicPartition

from libs.audit import audit_parallel
from libs.bus import KafkaBus, KafkaSettings, Topics, load_topic_config
from libs.events import decode, encode
from libs.events.logfile import read_log, write_log
from tests.golden.record import Scenario
from tests.integration.stack import ROOT, Stack
from tests.perf.live_bench import broker
from tests.perf.options import option
from tests.perf.ranges import Figure
from tests.perf.stats import console, fmt, table
from tests.signed_log import Signers, decide, sign

CACHE = ROOT / ".local" / "bench"
TRUST = CACHE / "trust"
ARRIVAL_S = 150.0


@dataclass(frozen=True)
class AuditParams:
    jobs: int = option(3000, "jobs per input partition", flag="--audit-jobs")
    partitions: int = option(4, "input partitions (one simulated cluster each)")
    workers: int = option(
        0, "audit processes (0: qm audit verify's default)", flag="--audit-workers"
    )
    bootstrap: str = "127.0.0.1:19092"


def _record(partition: int, jobs: int) -> Path:
    """One partition's log, made by the golden recorder and signed (cached)."""
    path = CACHE / f"audit-p{partition}-j{jobs}-a{ARRIVAL_S:.0f}-signed"
    inputs, decisions = path.with_suffix(".input.bin"), path.with_suffix(".decisions.bin")
    if not inputs.exists():
        steps = list(
            Scenario(
                partition + 3,
                jobs,
                partition=partition,
                cluster=f"c{partition}",
                arrival_s=ARRIVAL_S,
            ).steps()
        )
        signers = Signers(TRUST)
        sealed = sign((step.input for step in steps), signers)
        write_log(decisions, decide(sealed, signers.trust_file, partition))
        write_log(inputs, sealed)
    return path


def _logs(params: AuditParams) -> list[Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    Signers(TRUST)  # the services' keys, made once before the partitions are signed
    with ProcessPoolExecutor() as pool:
        return list(pool.map(_record, range(params.partitions), [params.jobs] * params.partitions))


async def _write(settings: KafkaSettings, topics: Topics, logs: list[Path]) -> int:
    """Each partition's inputs at their offsets; the decisions keyed by cluster."""
    producer = KafkaBus(settings).producer(linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    written = 0
    try:
        sent = []
        for partition, path in enumerate(logs):
            for env in read_log(path.with_suffix(".input.bin")):
                sent.append(
                    await producer.send(topics.events.name, encode(env), partition=partition)
                )
            for env in read_log(path.with_suffix(".decisions.bin")):
                sent.append(
                    await producer.send(
                        topics.decisions.name, encode(env), key=env.cluster.encode()
                    )
                )
            written += len(sent)
            await asyncio.gather(*sent)
            sent = []
    finally:
        await producer.stop()
    return written


async def _read_only(settings: KafkaSettings, topics: Topics) -> int:
    """The baseline: read and decode both topics to their ends, nothing else."""
    consumer = KafkaBus(settings).consumer(
        max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20
    )
    await consumer.start()
    try:
        tps = [
            TopicPartition(spec.name, p)
            for spec in (topics.events, topics.decisions)
            for p in range(spec.partitions)
        ]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        count = 0
        for tp in tps:
            await consumer.seek_to_beginning(tp)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500, max_records=50_000)).values():
                for record in records:
                    decode(record.value)
                    count += 1
        return count
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class AuditResult:
    records: int
    events: int
    seconds: float
    unchecked_seconds: float
    read_seconds: float
    read_records: int
    ok: bool


def scenario(workdir: Path, params: AuditParams) -> AuditResult:
    logs = _logs(params)
    stack = Stack(workdir, bootstrap=params.bootstrap, partitions=params.partitions)
    stack.create_topics()
    settings, topics = stack.kafka_settings(), load_topic_config(stack.topics_file)
    records = asyncio.run(_write(settings, topics, logs))
    started = time.monotonic()
    read = asyncio.run(_read_only(settings, topics))
    read_seconds = time.monotonic() - started
    started = time.monotonic()
    unchecked = audit_parallel(settings, topics, workers=params.workers or None)
    unchecked_seconds = time.monotonic() - started
    started = time.monotonic()
    result = audit_parallel(
        settings, topics, workers=params.workers or None, trust=Signers(TRUST).trust_file
    )
    seconds = time.monotonic() - started
    return AuditResult(
        records,
        result.inputs + result.checked,
        seconds,
        unchecked_seconds,
        read_seconds,
        read,
        result.ok and unchecked.ok,
    )


def run_audit(params: AuditParams) -> list[Figure]:
    with broker(params.bootstrap), tempfile.TemporaryDirectory() as workdir:
        result = scenario(Path(workdir), params)
    rate = result.events / result.seconds
    unchecked_rate = result.events / result.unchecked_seconds
    read_rate = result.read_records / result.read_seconds
    table(
        f"audit: {params.partitions} partitions × {params.jobs:,} jobs "
        f"({result.records:,} records); target ≥ 50,000 events/s",
        ["pass", "records", "s", "events/s"],
        [
            ["qm audit verify's replay", f"{result.events:,}", fmt(result.seconds), fmt(rate)],
            [
                "the same, signatures unchecked (baseline)",
                f"{result.events:,}",
                fmt(result.unchecked_seconds),
                fmt(unchecked_rate),
            ],
            [
                "read + decode only (baseline)",
                f"{result.read_records:,}",
                fmt(result.read_seconds),
                fmt(read_rate),
            ],
        ],
    )
    if not result.ok:
        console.print("audit: the log did not reproduce")
    return [
        Figure("audit.events_per_s", rate, "/s"),
        Figure("audit.unchecked_events_per_s", unchecked_rate, "/s"),
        Figure("audit.vs_unchecked", rate / unchecked_rate, "×"),
        Figure("audit.read_events_per_s", read_rate, "/s"),
        Figure("audit.vs_read", rate / read_rate, "×"),
        Figure("audit.ok", 1.0 if result.ok else 0.0, ""),
    ]
