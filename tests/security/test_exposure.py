"""No secret in reach of a task, none in a log: a job running as the sandbox account tries
every file of its stack's state folder and of the repository's ``.local`` (the broker's,
and a local stack's), and can read no token, password or key; no server (the console,
the projector, every service's metrics port, the gRPC services and the agent's log
server) writes a token it was sent, in the address or in a header, to its log. The check
itself is shown to catch a file left readable, and a secret logged.

A stack here lies in a folder every account may enter, so that what keeps its files from
a task is the stack's own doing (its folders, its logs 0600, umask 077), as in ``.local``.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import budget_service_pb2_grpc as bs_grpc
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import cluster_service_pb2_grpc as cs_grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import logs_pb2, logs_pb2_grpc

from libs.auth import SigningKey, issue_token
from services.grpc_server import bearer
from tests.integration.conftest import wait_for_end
from tests.integration.stack import ROOT, Stack
from tests.integration.test_job_lifecycle import submit
from tests.security.conftest import Suite
from tests.security.exposure import (
    READER,
    Secrets,
    exposed,
    files_under,
    found,
    logged,
    readable,
)

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="reading as another account needs root")


def read_as_nobody(paths: list[Path], folder: Path) -> list[Path]:
    """What the sandbox's default account could open of ``paths``, running ``READER``."""
    listing = folder / "paths.txt"
    listing.write_text("".join(f"{path}\n" for path in paths))
    listing.chmod(0o644)
    done = subprocess.run(
        ["python3", "-c", READER, str(listing)],  # as tasks do: the system's Python
        user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return readable(done.stdout)


@as_root
def test_the_check_catches_a_secret_another_account_can_read(shared: Path) -> None:
    """A copy of a state folder, readable where it should not be: the log holding a token
    and the world-readable key are caught; the same files kept as ``make up`` keeps
    them (the folder 0700) are out of reach."""
    token = issue_token("carol", SigningKey.generate())
    state = shared / "local"
    (state / "logs").mkdir(parents=True)
    (state / "tls").mkdir(mode=0o700)
    (state / "auth").mkdir(mode=0o700)
    files = {
        state / "logs" / "console.log": (f'"GET /?token={token} HTTP/1.1" 303\n', 0o644),
        state / "logs" / "budget.log": ("serving on 50052\n", 0o644),
        state / "auth" / "issuer.key": ("the-signing-key\n", 0o600),
        state / "tls" / "server.key": ("-----BEGIN PRIVATE KEY-----\n", 0o644),
        state / "kafka-users-admin": ("broker-password\n", 0o644),
    }
    for path, (content, mode) in files.items():
        path.write_text(content)
        path.chmod(mode)
    state.chmod(0o755)
    secrets = Secrets.of([state / "kafka-users-admin"], [b"the-signing-key"])
    paths = list(files_under(state))
    assert exposed(read_as_nobody(paths, shared), secrets) == {
        state / "logs" / "console.log": ["a token (eyJ...)"],
        state / "kafka-users-admin": [f"password file {state / 'kafka-users-admin'}"],
    }
    state.chmod(0o700)
    assert read_as_nobody(paths, shared) == []


def test_the_log_check_names_each_secret_a_log_holds(tmp_path: Path) -> None:
    users = tmp_path / "kafka" / "users"
    users.mkdir(parents=True)
    (users / "placement").write_text("placement-password\n")
    stack = Stack(tmp_path / "stack", users_dir=users)
    token = issue_token("alice", stack.signer)
    (stack.logs / "console.log").write_text(f"GET /api/view 200\nAuthorization: Bearer {token}\n")
    (stack.logs / "placement.log").write_text("login with placement-password\n")
    (stack.task_logs / "j-1.log").write_text(f"my key: {stack.private_keys[0].decode()}\n")
    (stack.logs / "budget.log").write_text("serving on 50052\n")
    (tmp_path / "kafka" / "logs").mkdir()
    (tmp_path / "kafka" / "logs" / "server.log").write_text("-----BEGIN PRIVATE KEY-----\n")
    assert logged([stack], Secrets.of_stacks([stack])) == {
        stack.logs / "console.log": ["a token (eyJ...)"],
        stack.logs / "placement.log": [f"password file {users / 'placement'}"],
        stack.task_logs / "j-1.log": ["signing key 1"],
        tmp_path / "kafka" / "logs" / "server.log": ["a private key"],
    }
    assert found(b"FeatureKeyJsonConverter", Secrets({})) == []  # "eyJ" alone is no token


@pytest.fixture(scope="module")
def stack(suite: Suite) -> Iterator[Stack]:
    """The whole stack with its console, in a folder every account may enter."""
    stack = Stack(suite.open_folder())
    suite.stacks.append(stack)
    try:
        stack.up()
        stack.start_console()
        yield stack
    finally:
        stack.down()


def get(url: str, token: str) -> int:
    """GET ``url`` with ``token`` in the address and in the header; the status."""
    request = urllib.request.Request(
        f"{url}?token={token}", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code


@pytest.mark.kafka
def test_no_server_logs_a_token_sent_in_the_address_or_a_header(stack: Stack) -> None:
    """Valid tokens (an operator's, the services' own), each sent to every server."""
    sent = {user: issue_token(user, stack.signer) for user in ("carol", "svc-console")}
    servers = [
        f"{stack.console_url}{path}" for path in ("/", "/api/view", "/login", "/events")
    ] + [
        f"http://127.0.0.1:{stack.projector_port}{path}" for path in ("/jobs", "/metrics")
    ] + [
        f"http://127.0.0.1:{port}/metrics"
        for name, port in stack.metrics_ports.items()
        if name not in ("projector", "console")  # they answer on their own web ports
    ]  # fmt: skip
    for url in servers:
        for token in sent.values():
            assert get(url, token) < 500, url
    carol = bearer(sent["carol"])
    js_grpc.JobServiceStub(stack.channel()).ListJobs(js.ListJobsRequest(), metadata=carol)
    bs_grpc.BudgetServiceStub(stack.budget_channel()).GetTree(bs.GetTreeRequest(), metadata=carol)
    nodes = cs_grpc.ClusterServiceStub(stack.channel()).ListNodes(
        cs.ListNodesRequest(), metadata=carol
    )
    endpoint = next(n.log_endpoint for n in nodes.nodes if n.log_endpoint)
    agent = logs_pb2_grpc.NodeLogServiceStub(grpc.insecure_channel(endpoint))
    with pytest.raises(grpc.RpcError):  # admission's reader alone may ask
        list(agent.ReadTaskLog(logs_pb2.ReadTaskLogRequest(job_id="j"), metadata=carol))
    assert "GET /login 400" in (stack.logs / "console.log").read_text()  # requests logged
    assert logged([stack], Secrets.of_stacks([stack])) == {}


@pytest.mark.kafka
@as_root
def test_a_task_as_the_sandbox_account_reads_no_secret(stack: Stack) -> None:
    """The job tries every file of the stack's state and of ``.local``; it could open a
    file left open on purpose (so it did try), and nothing that holds a secret."""
    control = stack.workdir / "readable-by-all.txt"
    control.write_text("nothing secret\n")
    control.chmod(0o644)
    paths = [control, *files_under(stack.workdir, ROOT / ".local")]
    listing = stack.workdir / "paths.txt"
    listing.write_text("".join(f"{path}\n" for path in paths))
    listing.chmod(0o644)
    jobs = js_grpc.JobServiceStub(stack.channel())
    job_id = submit(
        stack, jobs, gpus=1, gpu_type="H100", command=["python3", "-c", READER, str(listing)]
    )
    wait_for_end(stack, jobs, job_id)
    chunks = jobs.StreamLogs(js.StreamLogsRequest(job_id=job_id), metadata=stack.auth("alice"))
    could = readable(b"".join(chunk.data for chunk in chunks).decode())
    assert control in could
    assert exposed(could, Secrets.of_stacks([stack], ROOT / ".local")) == {}
