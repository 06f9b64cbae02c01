"""`qm logs`: a job's output, from the agent that ran it, through admission's access rules."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, logs_pb2, logs_pb2_grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.auth import issue_token
from libs.core import simulated
from services.grpc_server import bearer
from tests.integration.conftest import wait_for_end
from tests.integration.stack import ROOT, Stack
from tests.integration.test_job_lifecycle import submit


def qm_env(stack: Stack, user: str) -> dict[str, str]:
    """The environment of ``qm`` run by ``user`` against the stack."""
    return {
        **os.environ,
        "QM_ADDR": f"127.0.0.1:{stack.admission_port}",
        "QM_TOKEN": issue_token(user, stack.signer),
        "QM_TLS_CA": "",
    }


def qm(stack: Stack, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT, env=qm_env(stack, user), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def output(stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str, *, follow: bool) -> bytes:
    request = js.StreamLogsRequest(job_id=job_id, follow=follow)
    chunks = jobs.StreamLogs(request, metadata=stack.auth("alice"), timeout=60)
    return b"".join(chunk.data for chunk in chunks)


def test_the_readme_job_prints_42_through_qm_logs(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submit(stack, jobs, gpus=2, command=["python3", "-c", "print(42)"])
    wait_for_end(stack, jobs, job_id)
    shown = qm(stack, "alice", "logs", job_id)
    assert shown.returncode == 0, shown.stderr
    node = wait_for_end(stack, jobs, job_id).node_id
    attempt, task, printed = shown.stdout.splitlines()
    assert attempt == f"=== attempt 1 ({job_id}/0) on {node} ==="
    assert task.startswith(f"--- task {job_id}/0 on GPUs [") and printed == "42"


def test_following_a_waiting_job_streams_its_output_until_it_ends(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    script = "import time\nfor n in range(5):\n    print(n, flush=True); time.sleep(0.3)"
    job_id = submit(stack, jobs, gpus=1, command=["python3", "-c", script])
    followed = output(stack, jobs, job_id, follow=True)  # asked before it has started
    assert followed.splitlines()[1:] == [b"0", b"1", b"2", b"3", b"4"]
    assert output(stack, jobs, job_id, follow=False) == followed


def test_a_job_that_has_not_started_says_so(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    # Larger than the cluster: a simulated run (a command that must run is refused).
    job_id = submit(stack, jobs, gpus=64, command=["true"], env={simulated.SECONDS: "1"})
    shown = qm(stack, "alice", "logs", job_id)
    assert shown.returncode == 1 and "has not started yet" in shown.stderr
    assert "qm logs -f waits for it" in shown.stderr


def test_another_users_job_output_is_not_found(stack: Stack, jobs: js_grpc.JobServiceStub) -> None:
    job_id = submit(stack, jobs, gpus=1, command=["python3", "-c", "print('secret')"])
    wait_for_end(stack, jobs, job_id)
    shown = qm(stack, "bob", "logs", job_id)  # bob is of nlp only, the job vision's
    assert shown.returncode == 1 and "NOT_FOUND" in shown.stderr and "secret" not in shown.stdout


@pytest.mark.parametrize("caller", ["alice", "svc-admission"])
def test_an_agent_serves_its_logs_to_admissions_reader_only(stack: Stack, caller: str) -> None:
    nodes = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel()).ListNodes(
        cluster_service_pb2.ListNodesRequest(), metadata=stack.auth("alice"), timeout=30
    )
    endpoint = next(n.log_endpoint for n in nodes.nodes if n.log_endpoint)
    agent = logs_pb2_grpc.NodeLogServiceStub(grpc.insecure_channel(endpoint))
    request = logs_pb2.ReadTaskLogRequest(job_id="anything")
    with pytest.raises(grpc.RpcError) as refused:
        list(agent.ReadTaskLog(request, metadata=bearer(issue_token(caller, stack.signer))))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
