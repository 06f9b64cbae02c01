from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from aiokafka.structs import ConsumerRecord
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli.app import app
from libs.audit import audit_topics
from libs.bus import KafkaBus, KafkaSettings, load_topic_config
from tests.integration.stack import Stack

T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("stack"))
    try:
        stack.up()
        stack.wait_registered()
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def jobs(stack: Stack) -> js_grpc.JobServiceStub:
    return js_grpc.JobServiceStub(stack.channel())


def eventually(probe: Callable[[], T | None], timeout: float = 30, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or probe}")
        time.sleep(0.2)


def wait_for_end(
    stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str, timeout: float = 60
) -> types_pb2.Job:
    """Follow WatchJob until the job ends; return its last state."""
    last = None
    for change in jobs.WatchJob(
        js.WatchJobRequest(job_id=job_id), metadata=stack.auth("alice"), timeout=timeout
    ):
        last = change.job
    assert last is not None
    return last


def until_running(stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str) -> types_pb2.Job:
    """The job once its task runs."""

    def running() -> types_pb2.Job | None:
        job = jobs.GetJob(js.GetJobRequest(job_id=job_id), metadata=stack.auth("alice")).job
        return job if job.state == types_pb2.JOB_STATE_RUNNING else None

    return eventually(running, what=f"{job_id} to run")


def assert_audit_reproduces(stack: Stack, at_least: int) -> None:
    """Replay the session's log through the core (as `qm audit verify` does, and
    through that command too): every decision reproduces, and there are enough."""
    result = asyncio.run(
        audit_topics(
            stack.kafka_settings("auditor"),
            load_topic_config(Path(stack.topics_file)),
            stack.policy,
            group=stack.env["QM_PLACEMENT_GROUP"],
            trust=stack.trust_file,
        )
    )
    assert result.ok, (result.config, result.divergence)
    assert result.checked == result.reproduced >= at_least
    verdict = CliRunner().invoke(
        app, ["audit", "verify"], env={**stack.env, **stack.principal_env("auditor")}
    )
    assert verdict.exit_code == 0, verdict.output
    # The log may have grown between the two replays (a tick, a serving GPU lent back).
    counted = re.search(r"(\d+) decisions, (\d+) reproduced", verdict.output)
    assert counted is not None, verdict.output
    checked, reproduced = map(int, counted.groups())
    assert checked == reproduced >= result.checked, verdict.output


def read_topic(stack: Stack, key: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record currently in one of the session's topics (by config key)."""
    topic = getattr(load_topic_config(Path(stack.topics_file)), key).name
    return asyncio.run(committed_records(stack.kafka_settings(), topic))


async def committed_records(
    settings: KafkaSettings, topic: str
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every committed record of a topic, up to its end as of now."""
    consumer = KafkaBus(settings).consumer()
    await consumer.start()
    consumer.subscribe([topic])
    try:
        while not consumer.assignment():
            await asyncio.sleep(0.05)
        ends = await consumer.end_offsets(list(consumer.assignment()))
        records: list[ConsumerRecord[bytes, bytes]] = []
        while any([await consumer.position(tp) < end for tp, end in ends.items()]):
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()
