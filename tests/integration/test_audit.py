"""The audit against real logs: what the running placement decided, replayed byte for byte."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from typer.testing import CliRunner, Result

from cli.app import app
from libs.audit import Difference, audit_parallel, audit_topics
from libs.bus import KafkaSettings, Topics, load_topic_config
from libs.core import knobs, simulated
from libs.events import decode, encode, event_type, release
from libs.events.logfile import read_log
from tests.golden.record import HERE, Scenario
from tests.integration.conftest import assert_audit_reproduces, read_topic, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit


def test_every_decision_of_a_random_workload_reproduces(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    rng = random.Random(20260105)
    submitted = []
    for _ in range(16):
        gpu_type = rng.choice(("", "H100", "A100"))
        command = rng.choice((["true"], ["false"], ["sleep", f"0.{rng.randint(1, 9)}"]))
        # The A100 node is simulated: a job there asks for a simulated run.
        env = {simulated.SECONDS: f"0.{rng.randint(1, 9)}"} if gpu_type == "A100" else {}
        job_id = submit(
            stack,
            jobs,
            allocation=rng.choice(("vision", "nlp")),
            gpus=rng.choice((1, 1, 2, 3, 4)),
            gpu_type=gpu_type,
            command=command,
            env=env,
        )
        submitted.append(job_id)
    cancelled = [submit(stack, jobs, command=["sleep", "30"]) for _ in range(2)]
    for job_id in cancelled:
        jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))
    for job_id in submitted + cancelled:
        wait_for_end(stack, jobs, job_id)

    assert_audit_reproduces(stack, at_least=len(submitted + cancelled))
    # Placement named its knobs before its decisions: those the audit replayed under.
    records = read_topic(stack, "decisions")
    decided = [decode(r.value) for r in records]
    announced = [d.policy_configured for d in decided if event_type(d) == "policy_configured"]
    assert announced and all(dict(a.knobs) == knobs(stack.policy) for a in announced)
    # Each decision names the release that made it: this checkout's (the audit left it aside).
    named = {a.release for a in announced} | {
        getattr(d, event_type(d)).provenance.release
        for d in decided
        if event_type(d) != "policy_configured"
    }
    assert named == {release.current()}
    firsts = {r.partition: d for r, d in reversed(list(zip(records, decided, strict=True)))}
    assert {event_type(d) for d in firsts.values()} == {"policy_configured"}


def test_a_tampered_log_is_caught_over_kafka(tmp_path: Path) -> None:
    settings = KafkaSettings.from_env()
    golden = json.loads((HERE / "scheduler-contended-gpu-changed.json").read_text())
    with private_topics(settings, partitions=1) as topics:
        asyncio.run(_produce_files(settings, topics, golden["input"], golden["decisions"]))
        found = asyncio.run(audit_topics(settings, topics)).divergence
        assert found is not None
        assert (found.input_offset, found.index, found.difference.name) == (
            golden["divergence"]["input_offset"],
            golden["divergence"]["index"],
            golden["divergence"]["difference"],
        )

        verdict = _verify(tmp_path, topics)
    assert verdict.exit_code == 1, verdict.output
    assert f"input offset {found.input_offset}, decision #{found.index}" in verdict.output
    assert "differing fields: task_placed.gpu_indices" in verdict.output


def test_other_knobs_than_placements_are_named_over_kafka(tmp_path: Path) -> None:
    settings = KafkaSettings.from_env()
    golden = json.loads((HERE / "scheduler-basic.json").read_text())
    policy = tmp_path / "policy.yaml"
    policy.write_text("lookback_window_s: 86400\n")
    with private_topics(settings, partitions=1) as topics:
        asyncio.run(_produce_files(settings, topics, golden["input"], golden["decisions"]))
        verdict = _verify(tmp_path, topics, "--policy", str(policy))
        agrees = _verify(tmp_path, topics)
    assert verdict.exit_code == 1, verdict.output
    named = "configuration differs from the log's: lookback_window_s: log 604800.0, replay 86400.0"
    assert named in verdict.output.splitlines()
    assert verdict.output.index(named) < verdict.output.index("the first divergence")
    assert agrees.exit_code == 0, agrees.output


def _verify(tmp_path: Path, topics: Topics, *args: str) -> Result:
    topics_file = tmp_path / "topics.yaml"
    names = {f.name: {"name": getattr(topics, f.name).name} for f in dataclasses.fields(topics)}
    topics_file.write_text(yaml.safe_dump({"partitions": 1, "topics": names}))
    env = {"QM_TOPICS": str(topics_file), "QM_POLICY_FILE": "", "COLUMNS": "200"}
    return CliRunner().invoke(app, ["audit", "verify", *args], env=env)


async def _produce_files(
    settings: KafkaSettings, topics: Topics, inputs: str, decided: str
) -> None:
    producer = AIOKafkaProducer(**settings.client_kwargs(), enable_idempotence=True)
    await producer.start()
    try:
        for env in read_log(HERE / inputs):
            await producer.send(topics.events.name, encode(env), partition=0)
        for env in read_log(HERE / decided):
            await producer.send(topics.decisions.name, encode(env), partition=0)
        await producer.flush()
    finally:
        await producer.stop()


@contextmanager
def private_topics(settings: KafkaSettings, partitions: int) -> Iterator[Topics]:
    """Fresh events, decisions and snapshots topics of their own, deleted afterwards."""
    prefix = f"audit-{uuid.uuid4().hex[:8]}"
    config = load_topic_config()
    topics = dataclasses.replace(
        config,
        events=dataclasses.replace(config.events, name=f"{prefix}.events"),
        decisions=dataclasses.replace(config.decisions, name=f"{prefix}.decisions"),
        snapshots=dataclasses.replace(config.snapshots, name=f"{prefix}.snapshots"),
    )
    names = [topics.events.name, topics.decisions.name, topics.snapshots.name]
    asyncio.run(
        _admin(settings, lambda a: a.create_topics([NewTopic(n, partitions, 1) for n in names]))
    )
    try:
        yield topics
    finally:
        asyncio.run(_admin(settings, lambda a: a.delete_topics(names)))


async def _admin(
    settings: KafkaSettings, call: Callable[[AIOKafkaAdminClient], Awaitable[object]]
) -> None:
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    await admin.start()
    try:
        await call(admin)
    finally:
        await admin.close()


BENCH_EVENTS = int(os.environ.get("QM_AUDIT_BENCH_EVENTS", "0"))
BENCH_PARTITIONS = 4
# About half the nodes' capacity: a steady state. Faster arrivals grow the queue
# without end, and the scheduler's cost per event grows with its queue.
BENCH_ARRIVAL_S = 150.0


@pytest.mark.skipif(not BENCH_EVENTS, reason="set QM_AUDIT_BENCH_EVENTS=1000000 to measure")
@pytest.mark.timeout(3600)
def test_audit_rate() -> None:
    """Record a large log into private topics, time the audit of it."""
    settings = KafkaSettings.from_env()
    per_partition = BENCH_EVENTS // BENCH_PARTITIONS
    with private_topics(settings, BENCH_PARTITIONS) as topics:
        started = time.monotonic()
        with ProcessPoolExecutor(BENCH_PARTITIONS) as pool:
            decided = sum(
                pool.map(
                    _record_partition,
                    [settings] * BENCH_PARTITIONS,
                    [topics] * BENCH_PARTITIONS,
                    range(BENCH_PARTITIONS),
                    [per_partition] * BENCH_PARTITIONS,
                )
            )
        recorded_s = time.monotonic() - started
        started = time.monotonic()
        result = asyncio.run(audit_topics(settings, topics))
        audit_s = time.monotonic() - started
    print(
        f"\nrecorded {per_partition * BENCH_PARTITIONS} events, {decided} decisions in "
        f"{recorded_s:.0f} s; audit: {result.inputs} events, {result.checked} decisions in "
        f"{audit_s:.1f} s = {result.inputs / audit_s:,.0f} events/s"
    )
    assert result.divergence is None and result.inputs == per_partition * BENCH_PARTITIONS
    assert result.reproduced == decided


def _record_partition(settings: KafkaSettings, topics: Topics, partition: int, count: int) -> int:
    return asyncio.run(_produce_scenario(settings, topics, partition, count))


async def _produce_scenario(
    settings: KafkaSettings, topics: Topics, partition: int, count: int, drop_at: int = -1
) -> int:
    """The first ``count`` inputs of a scenario and their decisions; from input offset
    ``drop_at`` on (when not negative), the first decision is left off the log."""
    # Explicit partitions of fresh topics: offsets run 0, 1, 2, ... as the scenario numbers them.
    producer = AIOKafkaProducer(
        **settings.client_kwargs(),
        enable_idempotence=True,  # retries must not double a record and shift the offsets
        linger_ms=20,
        max_batch_size=1 << 20,
    )
    await producer.start()
    decided = 0
    try:
        scenario = Scenario(
            partition,
            count,
            partition=partition,
            cluster=f"c{partition}",
            arrival_s=BENCH_ARRIVAL_S,
        )
        for step in scenario.steps():
            if step.offset == count:
                break
            await producer.send(topics.events.name, encode(step.input), partition=partition)
            decisions = step.decisions
            if 0 <= drop_at <= step.offset and decisions:
                decisions, drop_at = decisions[1:], -1
            for decision in decisions:
                await producer.send(topics.decisions.name, encode(decision), partition=partition)
            decided += len(decisions)
        await producer.flush()
    finally:
        await producer.stop()
    return decided


def test_workers_reach_the_serial_verdict() -> None:
    settings = KafkaSettings.from_env()
    with private_topics(settings, partitions=4) as topics:
        for partition in range(4):
            asyncio.run(_produce_scenario(settings, topics, partition, 300))
        bars = _Bars()
        serial = audit_parallel(settings, topics, workers=1)
        parallel = audit_parallel(settings, topics, workers=3, progress=bars)
    assert serial.ok and serial.inputs == 4 * 300
    assert parallel == serial
    # The bar's total is known from the start, and reached.
    assert bars.tasks["events replayed"] == {"total": 1200, "completed": 1200}


def test_workers_find_a_divergence_in_a_later_partition() -> None:
    settings = KafkaSettings.from_env()
    with private_topics(settings, partitions=4) as topics:
        for partition in range(4):
            drop_at = 150 if partition == 2 else -1
            asyncio.run(_produce_scenario(settings, topics, partition, 300, drop_at))
        serial = audit_parallel(settings, topics, workers=1)
        parallel = audit_parallel(settings, topics, workers=2)
    found = serial.divergence
    assert found is not None and found.partition == 2 and found.input_offset >= 150
    assert found.difference is Difference.MISSING
    assert parallel.divergence == found and not parallel.ok


class _Bars:
    """A progress sink that keeps each task's last total and count."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, float | None]] = {}

    def add_task(self, description: str, *, total: float | None) -> str:
        self.tasks[description] = {"total": total, "completed": 0}
        return description

    def update(self, task_id: str, *, completed: float, total: float | None = None) -> None:
        self.tasks[task_id]["completed"] = completed
        if total is not None:
            self.tasks[task_id]["total"] = total
