"""Attacks on other people's jobs, against the real admission and projector: a job's
command and environment are seen by its owner, the members and managers of its
allocation and the root's managers; anyone else is told it does not exist."""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import pytest
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from tests.integration.conftest import eventually
from tests.integration.stack import Stack

# The stack's tree (tests/integration/stack.py): carol manages the root; vision's members
# are alice, its manager dana; nlp's members are bob and alice.


@pytest.fixture(scope="module")
def alices_job(front_door: Stack) -> str:
    jobs = js_grpc.JobServiceStub(front_door.channel())
    spec = types_pb2.JobSpec(
        gpus=1, allocation="vision", command=["train"], env={"WANDB_API_KEY": "alice-secret"}
    )
    reply = jobs.SubmitJob(js.SubmitJobRequest(spec=spec), metadata=front_door.auth("alice"))
    eventually(lambda: reply.job_id in listed(front_door, "carol"), what="the job in the projector")
    return reply.job_id


def listed(stack: Stack, user: str) -> list[str]:
    jobs = js_grpc.JobServiceStub(stack.channel())
    reply = jobs.ListJobs(js.ListJobsRequest(limit=1000), metadata=stack.auth(user), timeout=10)
    return [job.job_id for job in reply.jobs]


@pytest.mark.parametrize("user", ["alice", "dana", "carol"])
def test_the_owner_the_allocations_manager_and_the_roots_see_a_job(
    front_door: Stack, alices_job: str, user: str
) -> None:
    jobs = js_grpc.JobServiceStub(front_door.channel())
    job = jobs.GetJob(js.GetJobRequest(job_id=alices_job), metadata=front_door.auth(user)).job
    assert job.spec.env["WANDB_API_KEY"] == "alice-secret"
    assert alices_job in listed(front_door, user)


@pytest.mark.parametrize("user", ["bob", "mallory"])
def test_anyone_else_is_told_the_job_does_not_exist(
    front_door: Stack, alices_job: str, user: str
) -> None:
    """bob shares an allocation with alice (nlp), not this one; mallory has none."""
    jobs = js_grpc.JobServiceStub(front_door.channel())
    auth = front_door.auth(user)
    calls = [
        lambda: jobs.GetJob(js.GetJobRequest(job_id=alices_job), metadata=auth),
        lambda: jobs.ExplainJob(js.ExplainJobRequest(job_id=alices_job), metadata=auth),
        lambda: jobs.CancelJob(js.CancelJobRequest(job_id=alices_job), metadata=auth),
        lambda: next(iter(jobs.WatchJob(js.WatchJobRequest(job_id=alices_job), metadata=auth))),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert refused.value.details().startswith("no job") and alices_job in str(
            refused.value.details()
        )
    assert alices_job not in listed(front_door, user)


def test_the_projector_answers_no_one_but_admission(front_door: Stack, alices_job: str) -> None:
    base = f"http://127.0.0.1:{front_door.projector_port}"
    for token in (None, front_door.auth("carol")[0][1].removeprefix("Bearer ")):
        request = urllib.request.Request(f"{base}/jobs/{alices_job}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == (403 if token else 401)


def test_a_secrets_value_never_travels_with_its_job(front_door: Stack) -> None:
    """`qm submit --secret NAME` sends the name; the job on the log and in every view
    carries the name only (the node agent reads the value from its store)."""
    jobs = js_grpc.JobServiceStub(front_door.channel())
    spec = types_pb2.JobSpec(gpus=1, allocation="nlp", command=["train"], secrets=["HF_TOKEN"])
    reply = jobs.SubmitJob(js.SubmitJobRequest(spec=spec), metadata=front_door.auth("bob"))
    job = jobs.GetJob(js.GetJobRequest(job_id=reply.job_id), metadata=front_door.auth("bob")).job
    assert list(job.spec.secrets) == ["HF_TOKEN"] and "HF_TOKEN" not in job.spec.env
