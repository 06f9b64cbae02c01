"""The agent's side of node liveness: incarnations, heartbeats, being declared lost,
reports that outlast a broker outage, and task processes an earlier agent left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from qm.v1 import events_pb2, types_pb2

from services.node_agent import registration
from services.node_agent.agent import NodeAgent
from services.node_agent.reports import Reporter
from tests.unit.services.node_agent.doubles import Recorder, delivery
from tests.unit.services.node_agent.test_node_agent import make_agent, placement


@pytest.fixture
def tracer() -> Tracer:
    return TracerProvider().get_tracer("test")


@pytest.fixture
def agent(tmp_path: Path, emitted: Recorder, tracer: Tracer) -> NodeAgent:
    return make_agent(tmp_path, emitted, tracer)


async def test_each_registration_names_an_incarnation_and_the_heartbeat(
    agent: NodeAgent, emitted: Recorder
) -> None:
    await agent.register()
    first = [env.node_registered for env in emitted.events]
    assert [r.heartbeat_interval for r in first] == [Duration(seconds=5)] * 2
    assert len({r.incarnation for r in first}) == 2 and all(r.incarnation for r in first)


async def test_heartbeats_name_the_node_and_its_incarnation(
    tmp_path: Path, emitted: Recorder, tracer: Tracer
) -> None:
    agent = make_agent(tmp_path, emitted, tracer, heartbeat_s=0.01)
    await agent.register()
    incarnation = {
        e.node_registered.inventory.node_id: e.node_registered.incarnation for e in emitted.events
    }
    beating = asyncio.create_task(agent.heartbeat())
    await emitted.until(2 + 4)
    beating.cancel()
    beats = [env.node_heartbeat for env in emitted.events[2:6]]
    assert {(b.node_id, b.incarnation) for b in beats} == set(incarnation.items())


async def test_without_a_heartbeat_period_it_never_beats(
    tmp_path: Path, emitted: Recorder, tracer: Tracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registration, "UNTRUSTED_RETRY_S", 0.01)
    agent = make_agent(tmp_path, emitted, tracer, heartbeat_s=0)
    beating = asyncio.create_task(agent.heartbeat())
    await asyncio.sleep(0.1)  # ten rounds
    beating.cancel()
    assert emitted.events == []


async def test_a_node_placement_does_not_trust_registers_again_until_it_does(
    tmp_path: Path, emitted: Recorder, tracer: Tracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registration, "UNTRUSTED_RETRY_S", 0.01)
    agent = make_agent(tmp_path, emitted, tracer, heartbeat_s=0)
    node_id = next(iter(agent._registrations.nodes))
    refused = events_pb2.InputRefused(
        kind="node_registered",
        subject=f"node:{node_id}:00ff",
        reason="no operator has approved it",
        trust="unapproved_node",
    )
    assert await agent.handle(delivery(refused))
    beating = asyncio.create_task(agent.heartbeat())
    await emitted.until(1, "node_registered")
    await asyncio.sleep(0.1)  # no refusal came back: it registered once, and beats (never)
    beating.cancel()
    assert emitted.types() == ["node_registered"]
    other = events_pb2.InputRefused(subject="node:elsewhere:00ff", trust="unapproved_node")
    assert not await agent.handle(delivery(other))


async def test_a_placement_for_an_earlier_incarnation_is_ignored(
    agent: NodeAgent, emitted: Recorder
) -> None:
    stale = placement(duration_s=0)
    stale.node_incarnation = "an-earlier-agent"
    assert not await agent.handle(delivery(stale))
    await asyncio.sleep(0.05)
    assert emitted.types() == []


async def test_declared_lost_it_stops_the_nodes_tasks_and_registers_anew(
    agent: NodeAgent, emitted: Recorder
) -> None:
    await agent.register()
    old = emitted.events[0].node_registered.incarnation
    task = placement(duration_s=30)
    task.node_incarnation = old
    assert await agent.handle(delivery(task))
    lost = events_pb2.NodeLost(node_id="sim-0", incarnation=old, reason="no heartbeat")
    assert await agent.handle(delivery(lost, offset=1))
    await emitted.until(5)
    kinds = emitted.types()
    # Registered again only once its task has ended: its GPUs are free for what comes.
    assert kinds[2:] == ["task_started", "task_failed", "node_registered"]
    again = emitted.events[4].node_registered
    assert again.inventory.node_id == "sim-0" and again.incarnation not in ("", old)
    # A loss declared for the incarnation that just ended changes nothing more.
    assert not await agent.handle(delivery(lost, offset=2))


async def test_a_report_the_bus_refuses_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[events_pb2.Envelope] = []
    refusals = 2

    async def flaky(env: events_pb2.Envelope) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise ConnectionError("broker unreachable")
        sent.append(env)

    monkeypatch.setattr("services.node_agent.reports.RETRY_FIRST_S", 0.01)
    node = types_pb2.NodeInventory(node_id="sim-0")
    await Reporter(flaky)(node, events_pb2.TaskFinished(job_id="j", task_id="j/0"))
    assert refusals == 0 and [env.task_finished.task_id for env in sent] == ["j/0"]


async def test_a_closing_agent_tries_a_report_a_few_times_then_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries = 0

    async def down(env: events_pb2.Envelope) -> None:
        nonlocal tries
        tries += 1
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr("services.node_agent.reports.RETRY_FIRST_S", 0.01)
    reporter = Reporter(down)
    reporter.closing = True
    with pytest.raises(ConnectionError):
        await reporter(types_pb2.NodeInventory(node_id="n"), events_pb2.TaskFinished(job_id="j"))
    assert tries == 3
