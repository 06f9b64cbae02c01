"""A job's whole path through the real stack: gRPC, Kafka, placement, node agent, projector."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.core import simulated
from libs.events import decode, event_type
from services.admission.servicer import job_id_for
from services.node_agent.tasklogs import TaskLogs
from tests.integration.conftest import eventually, read_topic, wait_for_end
from tests.integration.stack import Stack


def submit(stack: Stack, jobs: js_grpc.JobServiceStub, user: str = "alice", **spec: object) -> str:
    spec.setdefault("allocation", "vision")
    spec.setdefault("gpus", 1)
    reply = jobs.SubmitJob(
        js.SubmitJobRequest(spec=types_pb2.JobSpec(**spec)),  # type: ignore[arg-type]
        metadata=stack.auth(user),
        timeout=30,
    )
    return str(reply.job_id)


def first_log(stack: Stack, job_id: str) -> Path:
    """Where the agent keeps the log of the job's first attempt."""
    return TaskLogs(stack.task_logs).path(job_id, f"{job_id}/0")


def test_a_job_runs_and_finishes(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    job_id = submit(stack, jobs, gpus=2, command=["python3", "-c", "print(42)"])
    job = wait_for_end(stack, jobs, job_id)
    assert types_pb2.JobState.Name(job.state) == "JOB_STATE_FINISHED", job
    assert job.exit_code == 0 and len(job.gpu_indices) == 2 and job.node_id.startswith("proc-")
    assert first_log(stack, job_id).read_text().strip().endswith("42")
    # vision's manager sees it too (bob, of nlp only, would be told it does not exist)
    got = jobs.GetJob(js.GetJobRequest(job_id=job_id), metadata=stack.auth("dana")).job
    assert got.state == types_pb2.JOB_STATE_FINISHED


def test_the_task_sees_its_gpus(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    script = "import os; print('gpus=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    job_id = submit(stack, jobs, gpus=3, command=["python3", "-c", script])
    job = wait_for_end(stack, jobs, job_id)
    expected = ",".join(str(g) for g in job.gpu_indices)
    assert f"gpus={expected}" in first_log(stack, job_id).read_text()


def test_a_failing_command_ends_failed_with_its_exit_code(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submit(stack, jobs, gpus=1, command=["python3", "-c", "import sys; sys.exit(3)"])
    job = wait_for_end(stack, jobs, job_id)
    assert job.state == types_pb2.JOB_STATE_FAILED and job.exit_code == 3


def test_a_simulated_node_runs_for_the_declared_duration(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submit(
        stack, jobs, gpus=8, gpu_type="A100", command=["train"], env={simulated.SECONDS: "0.5"}
    )
    job = wait_for_end(stack, jobs, job_id)
    assert job.state == types_pb2.JOB_STATE_FINISHED and job.node_id == "sim-0"
    assert job.finished_at.ToNanoseconds() - job.started_at.ToNanoseconds() >= 400_000_000


def test_a_bad_spec_is_refused_and_a_retry_gets_the_same_refusal(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    request_id = "bad-spec-1"
    with pytest.raises(grpc.RpcError) as caught:
        submit(stack, jobs, gpus=0, command=["true"], client_request_id=request_id)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gpus: must be at least 1, got 0" in caught.value.details()
    with pytest.raises(grpc.RpcError) as again:  # fixed, but the request id was answered
        submit(stack, jobs, gpus=1, command=["true"], client_request_id=request_id)
    assert (again.value.code(), again.value.details()) == (
        caught.value.code(),
        caught.value.details(),
    )
    job_id = job_id_for("alice", request_id)
    recorded = [
        event_type(env)
        for env in (decode(r.value) for r in read_topic(stack, "events"))
        if env.correlation_id == job_id
    ]
    assert recorded == ["job_submitted", "job_rejected"]  # the claim, then the answer


def test_a_retried_submission_is_one_job(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    first = submit(stack, jobs, command=["true"], client_request_id="retry-me")
    again = jobs.SubmitJob(
        js.SubmitJobRequest(
            spec=types_pb2.JobSpec(
                allocation="vision", gpus=1, command=["true"], client_request_id="retry-me"
            )
        ),
        metadata=stack.auth("alice"),
    )
    assert again.job_id == first and again.duplicate
    submitted = [
        env
        for env in (decode(r.value) for r in read_topic(stack, "events"))
        if event_type(env) == "job_submitted" and env.job_submitted.job_id == first
    ]
    assert len(submitted) == 1


def test_callers_must_authenticate_and_belong(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as anonymous:
        jobs.SubmitJob(js.SubmitJobRequest(spec=types_pb2.JobSpec(command=["true"])))
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as outsider:
        submit(stack, jobs, user="bob", command=["true"])
    assert outsider.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "bob is not a member of allocation 'vision'" in outsider.value.details()


def test_cancelling_a_running_job(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    job_id = submit(stack, jobs, command=["python3", "-c", "import time; time.sleep(120)"])
    eventually(
        lambda: (
            jobs.GetJob(js.GetJobRequest(job_id=job_id), metadata=stack.auth("alice")).job.state
            == types_pb2.JOB_STATE_RUNNING
        ),
        what="the job to run",
    )
    with pytest.raises(grpc.RpcError) as stranger:
        jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("bob"))
    assert stranger.value.code() == grpc.StatusCode.NOT_FOUND  # not his to see, nor cancel
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_CANCELLED


def test_a_job_too_big_for_any_node_explains_why(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    # A simulated run (a command that must run, larger than any node, is refused).
    job_id = submit(stack, jobs, gpus=64, command=["true"], env={simulated.SECONDS: "1"})
    explanation = eventually(
        lambda: (
            (
                e := jobs.ExplainJob(
                    js.ExplainJobRequest(job_id=job_id), metadata=stack.auth("alice")
                )
            ).state
            == types_pb2.JOB_STATE_PENDING
            and "needs" in e.reason
            and e
        ),
        what="a pending explanation",
    )
    # A simulated run goes to process or simulated nodes: 8 GPUs of each.
    assert "needs 64×GPU; the cluster has only 16 such GPUs" in explanation.reason
    # The scheduler's own reasoning: the allocation's fair-share standing.
    assert (explanation.allocation, explanation.ranks) == ("vision", 2)
    assert explanation.rank in (1, 2)
    assert f"vision ranks {explanation.rank} of 2 by fair share" in explanation.reason
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_CANCELLED


def test_nodes_are_listed(stack: Stack) -> None:
    stub = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel())
    reply = stub.ListNodes(cluster_service_pb2.ListNodesRequest(), metadata=stack.auth("alice"))
    assert [n.inventory.node_id for n in reply.nodes] == ["proc-0", "proc-1", "sim-0"]
    assert [len(n.inventory.gpus) for n in reply.nodes] == [4, 4, 8]
