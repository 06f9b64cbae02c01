"""The agent's Kafka shell (``serve``) over the in-memory bus: the decisions it reads,
what it reports to the log, what it commits and dead-letters."""

from __future__ import annotations

import asyncio

import yaml
from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventConsumer, EventProducer, load_topic_config
from libs.bus.deadletter import CONSUMER
from libs.bus.memory import MemoryBus
from libs.core import simulated
from libs.events import event_type, new_envelope
from services.node_agent.agent import NodeAgent, serve
from services.node_agent.executors import SimulatedExecutor
from services.node_agent.inventory import parse_inventory

TOPICS = load_topic_config()
EVENTS, DECISIONS = TOPICS.events.name, TOPICS.decisions.name
CLIENT = "qm-node-agent-test"
NODES = parse_inventory(
    yaml.safe_load(
        "nodes: [{node_id: sim-0, gpu_type: H100, gpu_count: 2, gpu_memory_gib: 80,"
        " executor: simulated}]"
    ),
    source="test",
)


def placement(job_id: str, incarnation: str = "") -> events_pb2.Envelope:
    placed = events_pb2.TaskPlaced(
        job_id=job_id,
        task_id=f"{job_id}/0",
        node_id="sim-0",
        node_incarnation=incarnation,
        gpu_indices=[0],
        spec=types_pb2.JobSpec(env={simulated.SECONDS: "0.01"}),
    )
    return new_envelope(placed, producer="placement", correlation_id=job_id)


def kinds(bus: MemoryBus) -> list[str]:
    return [event_type(env) for env in bus.envelopes(EVENTS)]


async def test_the_agent_acts_on_new_decisions_reports_them_and_commits_its_position() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    decisions = EventProducer(bus, client_id="placement")
    # Made before the agent started: a new agent acts on decisions from now on.
    await decisions.send(DECISIONS, placement("j-old"))
    producer = EventProducer(bus, client_id=CLIENT)

    async def emit(env: events_pb2.Envelope) -> None:
        await producer.send(EVENTS, env, key=env.cluster)

    agent = NodeAgent(
        NODES, executors={types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor()}, emit=emit
    )
    consumer = EventConsumer(
        bus,
        [DECISIONS],
        name=CLIENT,
        group_id=CLIENT,
        deadletter_topic=TOPICS.deadletter.name,
        deadletter_producer=producer,
        auto_offset_reset="latest",
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(agent, consumer, stop))
    await bus.until(lambda: kinds(bus) == ["node_registered"])
    [registered] = bus.envelopes(EVENTS)
    await (await bus.producer().send(DECISIONS, b"\x00garbage", b"default"))
    await decisions.send(DECISIONS, placement("j-1", registered.node_registered.incarnation))
    await decisions.send(DECISIONS, placement("j-2", "an-earlier-incarnation"))
    [tp] = {TopicPartition(DECISIONS, r.partition) for r in bus.records(DECISIONS)}
    await bus.until(lambda: bus.committed(CLIENT).get(tp) == 4)
    await bus.until(lambda: "task_finished" in kinds(bus))
    stop.set()
    await asyncio.wait_for(serving, 5)

    ran = [env for env in bus.envelopes(EVENTS) if env.correlation_id]
    assert [(event_type(env), env.correlation_id) for env in ran] == [
        ("task_started", "j-1"),
        ("task_finished", "j-1"),
    ]
    assert {r.key for r in bus.records(EVENTS)} == {b"default"}  # keyed by cluster
    [parked] = bus.records(TOPICS.deadletter.name)
    assert (parked.value, dict(parked.headers)[CONSUMER]) == (b"\x00garbage", CLIENT.encode())
