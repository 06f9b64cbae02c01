"""Views answer protobuf over HTTP; exercised through ProjectorClient, no broker."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from qm.v1 import events_pb2, job_service_pb2, types_pb2

from libs.auth import issue_token
from libs.readmodels import JobFilter, Scope
from services.projector.client import ProjectorClient, ProjectorError
from services.projector.contract import PROTOBUF
from services.projector.jobs.agents import project_jobs
from services.projector.nodes.agents import project_nodes
from services.projector.usage import state as usage
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    failed,
    finished,
    placed,
    registered,
    spec,
    started,
    stop,
    submitted,
)
from tests.unit.services.projector.conftest import SIGNER
from tests.unit.services.projector.signed import feed


async def feed_jobs(*envs: events_pb2.Envelope) -> None:
    await feed(project_jobs, *envs)


async def feed_nodes(*envs: events_pb2.Envelope) -> None:
    await feed(project_nodes, *envs)


async def test_get_job(client: ProjectorClient) -> None:
    await feed_jobs(submitted("j/1 odd id"), placed("j/1 odd id", "n1", [0, 1]))
    job = await client.get_job("j/1 odd id")
    assert job is not None
    assert (job.state, list(job.gpu_indices)) == (types_pb2.JOB_STATE_PLACED, [0, 1])
    assert await client.get_job("unknown") is None


async def test_list_jobs_newest_first_by_allocation_and_limit(client: ProjectorClient) -> None:
    await feed_jobs(
        submitted("old", at=T0, s=spec("team-a")),
        submitted("new", at=T0 + 2, s=spec("team-a")),
        submitted("other", at=T0 + 1, s=spec("team-b")),
    )
    assert [j.job_id for j in await client.list_jobs()] == ["new", "other", "old"]
    assert [j.job_id for j in await client.list_jobs(JobFilter(allocation="team-a"))] == [
        "new",
        "old",
    ]
    assert [j.job_id for j in await client.list_jobs(limit=1)] == ["new"]
    assert await client.list_jobs(JobFilter(allocation="team-z")) == []


async def test_list_nodes_sorted_by_cluster_without_ended_tasks(client: ProjectorClient) -> None:
    await feed_nodes(
        registered("n2", cluster="east"),
        registered("n1", cluster="west"),
        registered("n3", cluster="east"),
        finished("late", node="n2", cluster="east"),  # seen before its placement
        placed("late", "n2", [0]),
        placed("busy", "n2", [1]),
    )
    await feed_jobs(
        finished("late", node="n2", cluster="east"),
        placed("late", "n2", [0]),
        placed("busy", "n2", [1]),
    )
    assert [n.inventory.node_id for n in await client.list_nodes()] == ["n1", "n2", "n3"]
    east = await client.list_nodes("east")
    assert [n.inventory.node_id for n in east] == ["n2", "n3"]
    assert [t.task_id for t in east[0].running] == ["busy/0"]


async def test_answers_are_protobuf(client: ProjectorClient) -> None:
    await feed_jobs(submitted("j1"))
    url = f"{client.base_url}/jobs"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"limit": "5"}, headers=auth()) as response,
    ):
        assert response.content_type == PROTOBUF
        reply = job_service_pb2.ListJobsResponse.FromString(await response.read())
    assert [j.job_id for j in reply.jobs] == ["j1"]


async def test_list_jobs_by_owner_and_state_within_the_scope(client: ProjectorClient) -> None:
    bo = types_pb2.JobSpec(allocation="team-b", user="bo", gpus=1, command=["x"])
    await feed_jobs(
        submitted("ada-1", at=T0, s=spec("team-a")),
        submitted("ada-2", at=T0 + 1, s=spec("team-a")),
        placed("ada-2", "n1", [0]),
        submitted("bo-1", at=T0 + 2, s=bo),
    )
    assert [j.job_id for j in await client.list_jobs(JobFilter(user="bo"))] == ["bo-1"]
    running = JobFilter(states=frozenset({types_pb2.JOB_STATE_PLACED}))
    assert [j.job_id for j in await client.list_jobs(running)] == ["ada-2"]
    submitted_or_placed = JobFilter(
        states=frozenset({types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_SUBMITTED})
    )
    listed = await client.list_jobs(submitted_or_placed)
    assert [j.job_id for j in listed] == ["bo-1", "ada-2", "ada-1"]
    # ada may see only her own: asking for bo's jobs does not show them to her.
    assert await client.list_jobs(JobFilter(user="bo"), scope=Scope("ada")) == []


async def test_list_jobs_that_timed_out(client: ProjectorClient) -> None:
    limit = types_pb2.STOP_CAUSE_TIME_LIMIT
    await feed_jobs(
        submitted("slow"),
        placed("slow"),
        started("slow"),
        stop("slow", "reached its time limit of 5 s", cause=limit),
        failed("slow", "killed by SIGTERM", exit_code=-15),
        submitted("quick", at=T0 + 1),
        placed("quick"),
        finished("quick"),
    )
    timed_out = JobFilter(states=frozenset({types_pb2.JOB_STATE_TIMEOUT}))
    [job] = await client.list_jobs(timed_out)
    assert (job.job_id, job.reason) == ("slow", "reached its time limit of 5 s")


async def test_an_unknown_state_is_a_clear_error(client: ProjectorClient) -> None:
    url = f"{client.base_url}/jobs"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"state": "JOB_STATE_NAPPING"}, headers=auth()) as response,
    ):
        assert response.status == 400
        assert "JOB_STATE_NAPPING" in await response.text()


@pytest.mark.parametrize("limit", ["-1", "x", "²", ""])
async def test_bad_limit_is_a_clear_error(client: ProjectorClient, limit: str) -> None:
    url = f"{client.base_url}/jobs"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"limit": limit}, headers=auth()) as response,
    ):
        assert response.status == 400
        assert "limit must be a non-negative integer" in await response.text()


async def test_client_reports_answers_it_cannot_use(client: ProjectorClient) -> None:
    with pytest.raises(ProjectorError, match="400"):
        await client.list_jobs(limit=-1)


async def test_not_ready_before_tables_are_recovered(client: ProjectorClient) -> None:
    assert await client.ready() is False


def auth(user: str = "svc-admission") -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(user, SIGNER)}"}


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({}, 401, "missing 'Authorization: Bearer <token>'"),
        ({"Authorization": "Bearer junk"}, 401, "malformed token"),
        (auth("alice"), 403, "alice may not read the projector's views"),
    ],
)
async def test_only_known_services_read_the_views(
    client: ProjectorClient, headers: dict[str, str], status: int, says: str
) -> None:
    """A user asking the projector directly would skip admission's checks of who sees
    which job; probes still get /ready without a token."""
    await feed_jobs(submitted("j1"))
    async with aiohttp.ClientSession() as http:
        for path in ("/jobs", "/jobs/j1", "/nodes", "/usage"):
            async with http.get(f"{client.base_url}{path}", headers=headers) as response:
                assert response.status == status and says in await response.text(), path
        async with http.get(f"{client.base_url}/ready") as response:
            assert response.status in (200, 503)


async def test_metrics_say_what_the_views_say(client: ProjectorClient) -> None:
    """GPUs by state and waiting jobs per allocation, as the node and job views have them;
    for a metrics client's token only."""
    await feed_nodes(registered("n1", gpus=4), placed("busy", "n1", [0, 1]))
    await feed_jobs(
        submitted("busy", s=spec("team-a", gpus=2)),
        placed("busy", "n1", [0, 1]),
        submitted("waits", s=spec("team-b", gpus=3, min_runtime_s=600)),
        admitted("waits", s=spec("team-b", gpus=3, min_runtime_s=600)),
    )
    usage.rebuilt.set()
    url = f"{client.base_url}/metrics"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers=auth("svc-admission")) as response:
            assert response.status == 403
        async with http.get(url, headers=auth("svc-prometheus")) as response:
            assert response.status == 200
            text = await response.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    gpus = {
        state: samples[("qm_gpus", (("cluster", "default"), ("state", state)))]
        for state in ("busy", "idle", "free", "lost")
    }
    assert gpus == {"busy": 2, "idle": 0, "free": 2, "lost": 0}
    waiting = (("allocation", "team-b"), ("cluster", "default"))
    assert samples[("qm_waiting_jobs", waiting)] == 1
    assert samples[("qm_allocation_demand_gpus", waiting)] == 3  # charged, and it fits
