"""The projector folds only what the gate lets through: a record of the events topic that
is unsigned, signed by a key nobody approved or revoked, or says what its signer may not
say, is parked once (by the nodes agent) and folded by no view, nor by the usage ledger.
Placement's decisions are not signed, and not checked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from unittest import mock

import faust
import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventProducer, deadletter
from libs.bus.memory import MemoryBus
from libs.config.document import ConfigError
from libs.core.approvals import ApprovedKey
from libs.events import encode
from libs.trust import SigningKey, seal
from services.projector import trust
from services.projector.app import TOPICS
from services.projector.client import ProjectorClient
from services.projector.jobs.agents import project_jobs
from services.projector.jobs.tables import get_job
from services.projector.nodes.agents import project_nodes
from services.projector.nodes.tables import get_node
from services.projector.usage import agents
from services.projector.usage import state as usage
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    finished,
    placed,
    registered,
    started,
    submitted,
)
from tests.unit.services.projector.conftest import sent_headers
from tests.unit.services.projector.signed import (
    EVENTS,
    WRITERS_SEAL,
    approved,
    feed,
    node,
    put,
    revoked,
)

S = types_pb2.JobState


def signed_by(key: SigningKey, env: events_pb2.Envelope) -> bytes:
    return seal(env, key)


async def to_both(*records: bytes) -> None:
    """Records of the events topic, as the one stream gives them to both agents."""
    for agent in (project_jobs, project_nodes):
        async with agent.test_context() as test_agent:
            for record in records:
                await put(test_agent, record)


def parked(dead_letters: mock.AsyncMock) -> list[tuple[bytes, bytes, bytes]]:
    """(record, reason, who parked it) of each dead letter."""
    return [
        (
            call.kwargs["value"],
            sent_headers(call)[deadletter.REASON],
            sent_headers(call)[deadletter.CONSUMER],
        )
        for call in dead_letters.await_args_list
    ]


async def running_on(node_id: str, job_id: str = "j") -> None:
    """The node registered, the job admitted, placed there and started by it."""
    await feed(project_nodes, registered(node_id), placed(job_id, node_id))
    await feed(
        project_jobs,
        admitted(job_id),
        placed(job_id, node_id),
        started(job_id, node=node_id),
    )


async def test_a_nodes_sealed_report_on_its_own_task_is_folded(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    await running_on("n1")
    await feed(project_jobs, finished("j", node="n1"))
    await feed(project_nodes, finished("j", node="n1"))
    job = get_job("j")
    assert job is not None and (job.state, job.node_id) == (S.JOB_STATE_FINISHED, "n1")
    n1 = get_node("n1")
    assert n1 is not None and list(n1.running) == []
    assert n1.approved_key == node("n1").public and not n1.key_revoked
    dead_letters.assert_not_awaited()


async def test_an_unsigned_or_node_signed_job_admitted_shows_no_ghost_job(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    await feed(project_nodes, registered("n1"))
    unsigned = encode(admitted("ghost"))
    forged = signed_by(node("n1"), admitted("forged"))
    await to_both(unsigned, forged)
    assert get_job("ghost") is None and get_job("forged") is None
    nodes_agent = b"qm-projector.nodes"
    assert parked(dead_letters) == [
        (unsigned, b"untrusted (unsigned): job_admitted is not signed", nodes_agent),
        (
            forged,
            b"untrusted (out_of_role): node may not write job_admitted: only admission writes it",
            nodes_agent,
        ),
    ]


async def test_a_node_reports_only_on_its_own_tasks(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    """Node a, approved, with its own key: a task on node b is not a's to finish, whether
    the report names b or a."""
    await feed(project_nodes, registered("a"))
    await running_on("b")
    as_b = signed_by(node("a"), finished("j", node="b"))
    as_a = signed_by(node("a"), finished("j", node="a"))
    await to_both(as_b, as_a)
    job = get_job("j")
    assert job is not None and (job.state, job.node_id) == (S.JOB_STATE_RUNNING, "b")
    b = get_node("b")
    assert b is not None and [t.task_id for t in b.running] == ["j/0"]
    assert [reason for _, reason, _ in parked(dead_letters)] == [
        b"untrusted (out_of_role): node a may report only about itself, not about b",
        b"untrusted (out_of_role): node a reports on task j/0, which runs on b",
    ]


async def test_an_unapproved_node_is_not_listed(
    client: ProjectorClient, dead_letters: mock.AsyncMock
) -> None:
    await feed(project_nodes, registered("n1"))
    rogue = WRITERS_SEAL.seal(registered("rogue"))
    async with project_nodes.test_context() as agent:
        await put(agent, rogue)
        await put(agent, WRITERS_SEAL.seal(approved("later")))  # approved, never registered
    assert [n.inventory.node_id for n in await client.list_nodes()] == ["n1"]
    assert get_node("rogue") is None
    [(record, reason, _)] = parked(dead_letters)
    assert record == rogue
    assert reason.startswith(
        b"untrusted (unapproved_node): node_registered is signed by node rogue's key "
    )
    assert reason.endswith(
        b"and no operator has approved it (qm node pending, qm node approve rogue)"
    )


async def test_a_revoked_node_is_heard_no_more(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    await running_on("n1")
    async with project_nodes.test_context() as agent:
        await put(agent, WRITERS_SEAL.seal(revoked("n1")))
    n1 = get_node("n1")
    assert n1 is not None and n1.key_revoked and n1.approved_key == node("n1").public
    again = registered("n1", gpus=8, at=T0 + 5)
    await to_both(WRITERS_SEAL.seal(finished("j", node="n1")), WRITERS_SEAL.seal(again))
    job = get_job("j")
    assert job is not None and job.state == S.JOB_STATE_RUNNING
    n1 = get_node("n1")
    assert n1 is not None and len(n1.inventory.gpus) == 4
    assert [reason for _, reason, _ in parked(dead_letters)] == [
        b"untrusted (revoked_key): task_finished is signed by node n1, whose key is revoked",
        b"untrusted (revoked_key): node_registered is signed by node n1, whose key is revoked",
    ]


async def test_only_admission_approves(projector: faust.App, dead_letters: mock.AsyncMock) -> None:
    """A node cannot approve itself (its key is no one's yet): its registration stays
    refused."""
    self_approved = signed_by(node("n1"), approved("n1"))
    async with project_nodes.test_context() as agent:
        await put(agent, self_approved)
        await put(agent, WRITERS_SEAL.seal(registered("n1")))
    assert get_node("n1") is None
    assert [reason.split(b":")[0] for _, reason, _ in parked(dead_letters)] == [
        b"untrusted (unapproved_node)",
        b"untrusted (unapproved_node)",
    ]


async def test_decisions_are_not_checked_and_events_posing_as_them_are(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    """Placement's decisions topic has one writer: its records are unsigned. A decision
    on the events topic is no decision."""
    await feed(project_jobs, submitted("j"), placed("j", "n1"))  # unsigned, decisions topic
    async with project_jobs.test_context() as agent:
        await put(agent, encode(placed("k", "n1")), topic=EVENTS)
    job = get_job("j")
    assert job is not None and job.state == S.JOB_STATE_PLACED
    assert get_job("k") is None
    dead_letters.assert_not_awaited()  # the jobs agent skips; the nodes agent parks


def test_the_trust_file_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QM_TRUST_FILE")
    trust.gate.cache_clear()
    with pytest.raises(ConfigError, match="QM_TRUST_FILE is not set"):
        trust.gate()
    monkeypatch.setenv("QM_TRUST_FILE", "/nowhere/trust.yaml")
    with pytest.raises(ConfigError, match=r"/nowhere/trust\.yaml"):
        trust.gate()


# --- the usage ledger --------------------------------------------------------------

SPEC = types_pb2.JobSpec(
    allocation="team-a", gpus=2, min_runtime=Duration(seconds=600), command=["x"]
)


@pytest.fixture
def bus() -> Iterator[MemoryBus]:
    memory = MemoryBus.for_topics(TOPICS)
    with mock.patch.object(agents, "BUS", memory):
        yield memory


async def test_the_ledger_charges_no_forged_report_and_a_revocation_unmakes_no_charge(
    projector: faust.App, bus: MemoryBus
) -> None:
    """j runs 10 s on n1; n2 (approved too) and an unsigned record say it ended after
    1 s. n1's key is revoked after: its earlier reports still charge, its later do not."""
    log = [
        WRITERS_SEAL.seal(approved("n1")),
        WRITERS_SEAL.seal(approved("n2")),
        WRITERS_SEAL.seal(admitted("j", s=SPEC)),
        WRITERS_SEAL.seal(started("j", node="n1", at=T0)),
        signed_by(node("n2"), finished("j", node="n1", at=T0 + 1)),
        signed_by(node("n2"), finished("j", node="n2", at=T0 + 1)),
        encode(finished("j", node="n1", at=T0 + 1)),
        WRITERS_SEAL.seal(finished("j", node="n1", at=T0 + 10)),
        WRITERS_SEAL.seal(admitted("k", s=SPEC, at=T0 + 11)),
        WRITERS_SEAL.seal(revoked("n1", at=T0 + 11)),
        WRITERS_SEAL.seal(started("k", node="n1", at=T0 + 12)),
        encode(started("k", node="n2", at=T0 + 12)),
        WRITERS_SEAL.seal(admitted("ghost", s=SPEC, at=T0 + 12)).replace(b"team-a", b"team-b"),
        encode(started("ghost", node="n2", at=T0 + 12)),
        WRITERS_SEAL.seal(finished("k", node="n1", at=T0 + 100)),
    ]
    async with EventProducer(bus, client_id="test") as producer:
        for record in log:
            await producer.send_raw(EVENTS, record, key=b"default", headers=[])
    task = asyncio.create_task(agents.fold_events())
    await asyncio.wait_for(usage.rebuilt.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    cluster = usage.ledger.cluster("default")
    assert cluster is not None
    assert {a: u.allocated_gpu_s for a, u in cluster.usage().items()} == {"team-a": 20.0}
    assert cluster.node_key("n1") == ApprovedKey(node("n1").public, revoked=True)
