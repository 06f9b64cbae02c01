"""The agents move data: decode, check, fold, store; bad records are parked and skipped.
(What the gate refuses: ``test_projector_trust``.)"""

from __future__ import annotations

from unittest import mock

import faust
from qm.v1 import types_pb2

from libs.bus import deadletter
from services.projector.jobs.agents import project_jobs
from services.projector.jobs.tables import get_job, job_specs, jobs
from services.projector.nodes.agents import project_nodes
from services.projector.nodes.tables import get_node, nodes
from tests.unit.libs.readmodels.readmodel_builders import (
    admitted,
    finished,
    placed,
    registered,
    started,
    submitted,
    tick,
)
from tests.unit.services.projector.conftest import sent_headers
from tests.unit.services.projector.signed import feed, put_env


async def test_jobs_agent_folds_and_stores(projector: faust.App) -> None:
    await feed(
        project_jobs,
        submitted("j1"),
        admitted("j1"),
        placed("j1", "n2", [1]),
        started("j1", node="n2"),
    )
    job = get_job("j1")
    assert job is not None
    assert (job.state, job.node_id) == (types_pb2.JOB_STATE_RUNNING, "n2")
    # The job's own facts and its spec are records of their own.
    head = types_pb2.Job.FromString(jobs["j1"])
    assert (head.state, head.node_id, head.HasField("spec")) == (job.state, "n2", False)
    assert types_pb2.Job.FromString(job_specs["j1"]).spec == job.spec


async def test_nodes_agent_folds_and_stores(projector: faust.App) -> None:
    await feed(
        project_nodes,
        registered("n1"),
        placed("a", "n1", [0]),
        placed("b", "n1", [1]),
        finished("a"),
    )
    node = get_node("n1")
    assert node is not None
    assert [t.task_id for t in node.running] == ["b/0"]


async def test_envelopes_about_nothing_stored_are_skipped(projector: faust.App) -> None:
    await feed(project_jobs, tick(), registered("n1"))
    async with project_nodes.test_context() as nodes_agent:
        await put_env(nodes_agent, submitted("j1"))
    assert list(jobs.keys()) == []
    node = get_node("n1")  # its approval's record only: the jobs agent stores no node
    assert list(nodes.keys()) == ["n1"] and node is not None
    assert not node.HasField("registered_at")


async def test_undecodable_records_are_dead_lettered_and_processing_goes_on(
    projector: faust.App, dead_letters: mock.AsyncMock
) -> None:
    async with project_jobs.test_context() as agent:
        await agent.put(b"\xff\x00 not protobuf", key=b"default", partition=2)
        await agent.put(None, key=b"default")
        await put_env(agent, submitted("after"))
    assert get_job("after") is not None
    assert dead_letters.await_count == 2
    garbage, empty = dead_letters.await_args_list
    assert garbage.kwargs["value"] == b"\xff\x00 not protobuf"
    assert garbage.kwargs["key"] == b"default"
    headers = sent_headers(garbage)
    assert headers[deadletter.REASON].startswith(b"not a qm.v1.Envelope")
    assert headers[deadletter.SOURCE_PARTITION] == b"2"
    assert headers[deadletter.CONSUMER] == b"qm-projector.jobs"
    assert sent_headers(empty)[deadletter.REASON] == b"empty record value"
