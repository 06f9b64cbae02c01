"""Attacks on the bus: nobody produces or consumes without an account, and an account
does only what its service needs (libs/bus/access.py). Each refusal is paired with the
same client doing what it may, so a refusal is the broker's rule, not a broken client."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)
from qm.v1 import events_pb2, types_pb2

from libs.bus import KafkaBus, KafkaSettings, Topics, load_topic_config
from libs.events.envelope import encode, new_envelope
from tests.integration.conftest import committed_records
from tests.integration.stack import Stack

# A principal with no write grant at all is refused before the topic: an idempotent
# producer needs a write grant somewhere to get a producer id.
NOT_ALLOWED = (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """Topics of its own, and every principal with its ACLs (as `make up` makes them)."""
    stack = Stack(tmp_path_factory.mktemp("bus"))
    stack.create_topics()
    return stack


@pytest.fixture(scope="module")
def topics(stack: Stack) -> Topics:
    return load_topic_config(Path(stack.topics_file))


def forged_placement() -> bytes:
    """A TaskPlaced that would make a node agent run a command as itself."""
    placed = events_pb2.TaskPlaced(
        job_id="evil", task_id="evil/0", node_id="sim-0", gpu_indices=[0],
        spec=types_pb2.JobSpec(command=["sh", "-c", "id > /tmp/owned"]),
    )  # fmt: skip
    return encode(new_envelope(placed, producer="placement"))


async def produce(settings: KafkaSettings, topic: str, value: bytes) -> None:
    producer: AIOKafkaProducer = KafkaBus(settings).producer(request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(producer.start(), 30)
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"default"), 30)
    finally:
        await producer.stop()


def test_a_client_without_credentials_cannot_connect(stack: Stack, topics: Topics) -> None:
    anonymous = KafkaSettings.from_env({"QM_KAFKA_BOOTSTRAP": stack.bootstrap})
    with pytest.raises(KafkaConnectionError):
        asyncio.run(produce(anonymous, topics.decisions.name, forged_placement()))
    assert asyncio.run(committed_records(stack.kafka_settings(), topics.decisions.name)) == []


def test_a_wrong_password_is_refused(stack: Stack, topics: Topics) -> None:
    guess = KafkaSettings.from_env(
        {**stack.env, "QM_KAFKA_SASL_USERNAME": "placement", "QM_KAFKA_SASL_PASSWORD": "guess",
         "QM_KAFKA_SASL_PASSWORD_FILE": ""}
    )  # fmt: skip
    with pytest.raises(KafkaConnectionError):
        asyncio.run(produce(guess, topics.decisions.name, forged_placement()))
    assert asyncio.run(committed_records(stack.kafka_settings(), topics.decisions.name)) == []


def test_a_node_agent_cannot_forge_a_placement_but_reports_its_events(
    stack: Stack, topics: Topics
) -> None:
    agent = stack.kafka_settings("node-agent")
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(produce(agent, topics.decisions.name, forged_placement()))
    assert asyncio.run(committed_records(stack.kafka_settings(), topics.decisions.name)) == []
    heartbeat = new_envelope(events_pb2.NodeHeartbeat(node_id="sim-0"), producer="node-agent")
    asyncio.run(produce(agent, topics.events.name, encode(heartbeat)))


@pytest.mark.parametrize("principal", ["auditor", "admission", "budget", "ticker", "projector"])
def test_only_placement_writes_decisions(stack: Stack, topics: Topics, principal: str) -> None:
    with pytest.raises(NOT_ALLOWED):
        asyncio.run(
            produce(stack.kafka_settings(principal), topics.decisions.name, forged_placement())
        )
    assert asyncio.run(committed_records(stack.kafka_settings(), topics.decisions.name)) == []


def test_the_auditor_reads_the_log_and_writes_nothing(stack: Stack, topics: Topics) -> None:
    auditor = stack.kafka_settings("auditor")
    asyncio.run(committed_records(auditor, topics.events.name))  # allowed
    with pytest.raises(NOT_ALLOWED):
        asyncio.run(produce(auditor, topics.events.name, b"\x00"))


def test_a_node_agent_cannot_join_placements_group(stack: Stack, topics: Topics) -> None:
    """Joining would take placement's partitions and stop scheduling."""

    async def join() -> None:
        intruder = KafkaBus(stack.kafka_settings("node-agent")).consumer(
            group_id=stack.env["QM_PLACEMENT_GROUP"]
        )
        await intruder.start()
        try:
            intruder.subscribe([topics.decisions.name])
            await asyncio.wait_for(intruder.getone(), 30)
        finally:
            await intruder.stop()

    with pytest.raises(GroupAuthorizationFailedError):
        asyncio.run(join())


def test_the_tls_listener_wants_tls_and_the_brokers_ca(stack: Stack) -> None:
    """`make test` starts the broker with a second, TLS listener (QM_KAFKA_TLS_PORT)."""
    port = os.environ.get("QM_KAFKA_TLS_PORT")
    if not port:
        pytest.skip("the broker was started without QM_KAFKA_TLS_PORT (make test sets it)")
    ca = stack.users_dir.parent / "tls" / "ca.crt"
    tls = {"QM_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "QM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}

    async def topics(settings: KafkaSettings) -> list[str]:
        admin = KafkaBus(settings).admin()
        try:
            await asyncio.wait_for(admin.start(), 30)
            return list(await admin.list_topics())
        finally:
            await admin.close()

    auditor = {**stack.env, **stack.principal_env("auditor"), **tls}
    assert asyncio.run(topics(KafkaSettings.from_env({**auditor, "QM_KAFKA_SSL_CAFILE": str(ca)})))
    plain = {**auditor, "QM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}
    with pytest.raises(KafkaConnectionError):  # plain text on the TLS port
        asyncio.run(topics(KafkaSettings.from_env(plain)))
    with pytest.raises(KafkaConnectionError):  # a CA that did not sign the broker's certificate
        asyncio.run(topics(KafkaSettings.from_env(auditor)))  # the system's CAs
