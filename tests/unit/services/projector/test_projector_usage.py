"""The usage ledger's reader, snapshot publishing and view; no broker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, cast
from unittest import mock

import aiohttp
import faust
import pytest
from aiohttp.test_utils import TestServer
from aiokafka.errors import KafkaTimeoutError
from faust.web.drivers.aiohttp import Web as AiohttpWeb
from google.protobuf.duration_pb2 import Duration
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventProducer
from libs.bus.memory import MemoryBus
from libs.bus.producer import TYPE_HEADER
from libs.core import PolicyConfig, config_digest
from libs.events import decode, new_envelope
from libs.events.log_step import policy_configured
from libs.events.snapshot import SnapshotError
from libs.readmodels import UsageLedger
from services.projector.app import TOPICS
from services.projector.client import ProjectorClient, ProjectorError
from services.projector.contract import CONFIG
from services.projector.usage import agents, snapshots
from services.projector.usage import state as usage
from tests.unit.libs.readmodels.readmodel_builders import T0, admitted, finished, started, tick
from tests.unit.services.projector.signed import WRITERS_SEAL, approved

Apply = Callable[[events_pb2.Envelope], None]

SPEC = types_pb2.JobSpec(
    allocation="team-a", gpus=2, min_runtime=Duration(seconds=600), command=["x"]
)
LOG = [admitted("j", s=SPEC), started("j", at=T0), finished("j", at=T0 + 10)]
# A job whose task ends with its node: placement says so, no agent does.
LOST_JOB = [admitted("k", s=SPEC), started("k", at=T0)]
LOST = new_envelope(
    events_pb2.TaskLost(job_id="k", task_id="k/0", node_id="n1"),
    producer="placement",
    occurred=datetime.fromtimestamp(T0 + 15, UTC),
)


@pytest.fixture
def bus() -> Iterator[MemoryBus]:
    """The log the ledger is read from: ``LOG`` and ``LOST_JOB`` as events, ``LOST`` as
    placement's decision."""
    memory = MemoryBus.for_topics(TOPICS)
    with mock.patch.object(agents, "BUS", memory):
        yield memory


def writers(bus: MemoryBus) -> EventProducer:
    """A producer that seals each record as its writer would (placement's, not)."""
    return EventProducer(bus, client_id="test", sealer=WRITERS_SEAL)


async def write_log(producer: EventProducer) -> None:
    for env in [approved("n1"), *LOG, *LOST_JOB]:
        await producer.send(TOPICS.events.name, env)
    await producer.send(TOPICS.decisions.name, LOST)


async def test_the_ledger_is_rebuilt_from_the_log_then_follows_it(
    projector: faust.App, bus: MemoryBus
) -> None:
    async with writers(bus) as producer:
        await write_log(producer)
        task = asyncio.create_task(agents.fold_events())
        await asyncio.wait_for(usage.rebuilt.wait(), 5)
        cluster = usage.ledger.cluster("default")
        assert cluster is not None
        # j ran 10 s, k 15 s until its node was lost: 2 GPUs each.
        assert cluster.usage()["team-a"].allocated_gpu_s == 50.0
        await producer.send(TOPICS.events.name, tick(T0 + 20))
        await bus.until(lambda: cluster.now == T0 + 20)  # followed
        assert cluster.usage()["team-a"].allocated_gpu_s == 50.0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def sending(*outcomes: BaseException | None) -> mock.AsyncMock:
    """A stand-in for ``Topic.send``: each call's delivery fails with the next outcome, or not."""
    results = iter(outcomes)

    async def delivered(outcome: BaseException | None) -> None:
        if outcome is not None:
            raise outcome

    async def send(**kwargs: Any) -> Awaitable[None]:
        return delivered(next(results, None))

    return mock.AsyncMock(side_effect=send)


def fold(*envs: events_pb2.Envelope) -> None:
    for env in envs:
        usage.ledger.apply(env)


async def test_nothing_is_published_before_the_ledger_is_rebuilt(projector: faust.App) -> None:
    fold(*LOG)
    with mock.patch.object(agents.events_out, "send", sending()) as send:
        assert await agents.publish_snapshots() == 0
    send.assert_not_awaited()


async def test_changed_snapshots_are_published_once(projector: faust.App) -> None:
    fold(*LOG, tick(T0 + 30, cluster="east"))
    usage.rebuilt.set()
    with mock.patch.object(agents.events_out, "send", sending()) as send:
        assert await agents.publish_snapshots() == 1
        assert await agents.publish_snapshots() == 0
        fold(admitted("k", at=T0 + 40, s=SPEC), started("k", at=T0 + 40), tick(T0 + 41))
        assert await agents.publish_snapshots() == 1
    first, second = (decode(call.kwargs["value"]) for call in send.await_args_list)
    assert send.await_args_list[0].kwargs["key"] == b"default"
    assert dict(send.await_args_list[0].kwargs["headers"])[TYPE_HEADER] == b"usage_snapshot"
    assert (first.producer, first.cluster, first.occurred_at.seconds) == (
        "projector",
        "default",
        int(T0) + 10,
    )
    assert [u.allocated_gpu_s for u in first.usage_snapshot.usage] == [20.0]
    assert [u.allocated_gpu_s for u in second.usage_snapshot.usage] == [22.0]


async def test_a_snapshot_that_failed_to_go_out_is_sent_next_time(projector: faust.App) -> None:
    fold(*LOG)
    usage.rebuilt.set()
    with mock.patch.object(agents.events_out, "send", sending(KafkaTimeoutError())) as send:
        assert await agents.publish_snapshots() == 0
        assert await agents.publish_snapshots() == 1
    assert send.await_count == 2


async def test_usage_view_answers_balances_once_rebuilt(client: ProjectorClient) -> None:
    with pytest.raises(ProjectorError, match="503"):
        await client.usage()
    fold(*LOG, tick(T0 + 5, cluster="east"))
    usage.rebuilt.set()
    balances = await client.usage()
    assert [(b.allocation, b.entitlement, b.gpu_seconds) for b in balances.balances] == [
        ("team-a", 0.0, 20.0)
    ]
    assert list((await client.usage("east")).balances) == []
    assert list((await client.usage("north")).balances) == []


async def test_placement_under_another_window_is_said_loudly(
    projector: faust.App, bus: MemoryBus, caplog: pytest.LogCaptureFixture
) -> None:
    assert PolicyConfig().lookback_window_s == usage.WINDOW_S
    placement = PolicyConfig(lookback_window_s=3600)
    server = TestServer(cast(AiohttpWeb, projector.web).web_app)
    await server.start_server()
    async with aiohttp.ClientSession() as http, writers(bus) as producer:
        async with http.get(server.make_url(CONFIG)) as agrees:
            assert agrees.status == 200
        await write_log(producer)
        task = asyncio.create_task(agents.fold_events())
        await asyncio.wait_for(usage.rebuilt.wait(), 5)
        configured = policy_configured(placement, LOG[0], partition=0, offset=0)
        await producer.send(TOPICS.decisions.name, configured)  # followed
        await bus.until(lambda: any(r.levelname == "ERROR" for r in caplog.records))
        async with http.get(server.make_url(CONFIG)) as differs:
            said, status = await differs.text(), differs.status
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await server.close()
    assert status == 409
    named = "lookback_window_s: placement 3600.0, projector 604800.0"
    assert said == f"placement decides under other knobs than the projector: {named}"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [said]


async def test_a_restart_loads_the_ledgers_snapshot_and_folds_only_what_follows(
    projector: faust.App, bus: MemoryBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger=agents.__name__)
    snapshots_topic = TOPICS.usage_snapshots.name
    with (
        mock.patch.object(agents, "SNAPSHOT_EVERY", 3),
        mock.patch.object(agents, "SNAPSHOT_CHECK_S", 0.01),
    ):
        async with writers(bus) as producer:
            await write_log(producer)
            first = asyncio.create_task(agents.fold_events())
            await bus.until(lambda: bool(bus.records(snapshots_topic)))
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            folded = usage.ledger.cluster("default")
            assert folded is not None
            before = folded.usage()
            # Restarted: nothing in memory, and one event after the snapshot.
            usage.ledger = UsageLedger(usage.WINDOW_S)
            usage.rebuilt.clear()
            await producer.send(TOPICS.events.name, tick(T0 + 20))
            caplog.clear()
            second = asyncio.create_task(agents.fold_events())
            await asyncio.wait_for(usage.rebuilt.wait(), 5)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    cluster = usage.ledger.cluster("default")
    assert cluster is not None and cluster.now == T0 + 20
    assert cluster.usage() == before  # j's 10 s and k's 15 s, as folded before
    assert "usage ledger rebuilt from 1 events" in caplog.text


async def test_a_damaged_or_foreign_ledger_snapshot_is_not_loaded(
    projector: faust.App, bus: MemoryBus
) -> None:
    snapshot = snapshots.take(
        usage.ledger,
        usage.placement,
        events={0: 99},
        decisions={},
        config=PolicyConfig(lookback_window_s=5.0),
        taken_at=datetime.now(UTC),
    )
    with pytest.raises(SnapshotError, match="other knobs"):
        snapshots.restore(snapshot, usage.LEDGER_CONFIG)
    snapshot.config_digest = config_digest(usage.LEDGER_CONFIG)
    snapshot.state = snapshot.state[:-1]
    with pytest.raises(SnapshotError, match="does not hash"):
        snapshots.restore(snapshot, usage.LEDGER_CONFIG)
