"""The API from another language: the Go client (clients/go) is built with `go build` and
its example submits a job to a real admission over TLS with a bearer token, reads it
back and lists jobs; what it submitted is what the Python side reads, and it runs.

Skipped, saying so, where Go is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.auth import issue_token
from libs.core import simulated
from services.tls import TlsSettings, channel
from tests.integration.conftest import eventually, wait_for_end
from tests.integration.stack import ROOT, Stack, free_port

sys.path.insert(0, str(ROOT / "deploy" / "local"))
from certs import make

GO = shutil.which("go")
pytestmark = pytest.mark.skipif(
    GO is None, reason="Go is not installed: the Go client cannot be built"
)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example program, built from the committed generated code."""
    binary = tmp_path_factory.mktemp("go") / "qm-example"
    subprocess.run(
        [str(GO), "build", "-o", str(binary), "./cmd/qm-example"],
        cwd=ROOT / "clients" / "go",
        check=True,
        timeout=600,
    )
    return binary


@pytest.fixture(scope="module")
def tls_admission(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A second admission on the stack, serving TLS (as `make up` does); its address and CA."""
    certs = tmp_path_factory.mktemp("tls")
    make(certs)
    address = f"127.0.0.1:{free_port()}"
    served = {
        "QM_ADMISSION_ADDR": address,
        "QM_TLS_CERT": str(certs / "server.crt"),
        "QM_TLS_KEY": str(certs / "server.key"),
    }
    stack.start_instance("admission-tls", "admission", served)
    trusting = TlsSettings.from_env({"QM_TLS_CA": str(certs / "ca.crt")})
    eventually(lambda: serving(address, trusting), timeout=60, what="admission over TLS")
    yield address, certs / "ca.crt"
    stack.stop("admission-tls")


def serving(address: str, tls: TlsSettings) -> bool:
    with channel(address, tls) as health:
        try:
            reply = health_pb2_grpc.HealthStub(health).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def run_example(
    example: Path, address: str, ca: Path, token: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "QM_ADDR": address, "QM_TLS_CA": str(ca)}
    return subprocess.run(
        [str(example), *args],
        env={**env, "QM_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_go_client_submits_reads_back_and_lists_a_job(
    stack: Stack,
    jobs: js_grpc.JobServiceStub,
    example: Path,
    tls_admission: tuple[str, Path],
) -> None:
    address, ca = tls_admission
    token = issue_token("alice", stack.signer)
    # A100 nodes are the stack's simulated ones: "train" runs there for the 0.5 s asked.
    args = ("-allocation", "vision", "-gpus", "2", "-gpu-type", "A100")
    args += ("-min-runtime", "60s", "-sim-seconds", "0.5")
    result = run_example(example, address, ca, token, *args, "--", "train")
    assert result.returncode == 0, result.stderr
    submitted, got, listed = result.stdout.splitlines()
    job_id = submitted.removeprefix("submitted ")
    assert got.startswith(f"got {job_id} JOB_STATE_") and "allocation=vision gpus=2" in got
    assert "min_runtime=1m0s" in got and f"{simulated.SECONDS}:0.5" in got
    assert listed.endswith(f"jobs, {job_id} among them")

    # What Go sent is what Python reads: durations and the simulation entry included.
    job = jobs.GetJob(js.GetJobRequest(job_id=job_id), metadata=stack.auth("alice")).job
    assert (job.spec.user, job.spec.gpus, list(job.spec.command)) == ("alice", 2, ["train"])
    assert job.spec.min_runtime == Duration(seconds=60)
    assert dict(job.spec.env) == {simulated.SECONDS: "0.5"}
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_FINISHED


def test_the_go_client_is_refused_without_a_valid_token(
    example: Path, tls_admission: tuple[str, Path]
) -> None:
    address, ca = tls_admission
    result = run_example(example, address, ca, "not-a-token")
    assert result.returncode == 1
    assert "submit:" in result.stderr and "Unauthenticated" in result.stderr
