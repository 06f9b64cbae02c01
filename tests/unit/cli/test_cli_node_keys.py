"""``qm node pending``, ``qm node approve`` and ``qm node revoke`` against a ClusterService
in this process: what they ask, what they print, and how a refusal reads."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import cluster_service_pb2_grpc as cs_grpc
from typer.testing import CliRunner, Result

from cli import render
from cli.app import app
from tests.unit.cli.conftest import text

FP = "0123456789abcdef0123456789abcdef"


def pending_node(node_id: str, *, replaces_key: bool = False, age_s: int = 90) -> cs.PendingNode:
    offered = Timestamp(seconds=int(time.time()) - age_s)
    return cs.PendingNode(
        node_id=node_id,
        cluster="default",
        fingerprint=FP,
        offered_at=offered,
        replaces_key=replaces_key,
    )


class Cluster(cs_grpc.ClusterServiceServicer):
    """Admission's ClusterService as far as nodes' keys go: it records each request."""

    def __init__(self) -> None:
        self.pending: list[cs.PendingNode] = []
        self.requests: list[object] = []
        self.refuse: tuple[grpc.StatusCode, str] | None = None

    def ListPendingNodes(
        self, request: cs.ListPendingNodesRequest, context: grpc.ServicerContext
    ) -> cs.ListPendingNodesResponse:
        self.requests.append(request)
        listed = [n for n in self.pending if not request.cluster or n.cluster == request.cluster]
        return cs.ListPendingNodesResponse(nodes=listed)

    def ApproveNode(
        self, request: cs.ApproveNodeRequest, context: grpc.ServicerContext
    ) -> cs.ApproveNodeResponse:
        self.requests.append(request)
        if self.refuse is not None:
            context.abort(*self.refuse)
        [node] = [n for n in self.pending if n.node_id == request.node_id]
        return cs.ApproveNodeResponse(node=node)

    def RevokeNode(
        self, request: cs.RevokeNodeRequest, context: grpc.ServicerContext
    ) -> cs.RevokeNodeResponse:
        self.requests.append(request)
        if self.refuse is not None:
            context.abort(*self.refuse)
        return cs.RevokeNodeResponse(node_id=request.node_id, cluster=request.cluster or "default")


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    """The service, and the environment qm calls it with."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    service = Cluster()  # type: ignore[abstract]  # the RPCs of nodes' keys alone
    cs_grpc.add_ClusterServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    env = {"QM_ADDR": f"127.0.0.1:{port}", "QM_TOKEN": "qm1.test.token", "QM_TLS_CA": ""}
    try:
        yield service, env
    finally:
        server.stop(grace=None)


def qm(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def test_pending_lists_each_node_with_its_fingerprint_and_age(
    cluster: tuple[Cluster, dict[str, str]],
) -> None:
    service, env = cluster
    service.pending = [pending_node("n1"), pending_node("n2", replaces_key=True, age_s=7200)]
    result = qm(env, "node", "pending", "--cluster", "default")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(word in lines[1] for word in ("NODE", "CLUSTER", "FINGERPRINT", "OFFERED"))
    [n1] = [line for line in lines if "n1" in line]
    assert "default" in n1 and FP in n1 and "1m30s ago" in n1 and "replaces" not in n1
    [n2] = [line for line in lines if "n2" in line]
    assert "2h ago" in n2 and "replaces an approved key" in n2
    assert service.requests == [cs.ListPendingNodesRequest(cluster="default")]


def test_pending_as_json_is_the_reply(cluster: tuple[Cluster, dict[str, str]]) -> None:
    service, env = cluster
    service.pending = [pending_node("n1", replaces_key=True)]
    result = qm(env, "node", "pending", "-o", "json")
    assert result.exit_code == 0, result.output
    [node] = json.loads(result.stdout)["nodes"]
    assert (node["node_id"], node["fingerprint"], node["replaces_key"]) == ("n1", FP, True)
    assert node["offered_at"].endswith("Z")


def test_approve_asks_for_the_node_and_says_what_it_trusts(
    cluster: tuple[Cluster, dict[str, str]],
) -> None:
    service, env = cluster
    service.pending = [pending_node("n1")]
    result = qm(env, "node", "approve", "n1", "--fingerprint", FP, "--cluster", "default")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"approved node n1 (key {FP}): its events are trusted from now on"
    )
    assert service.requests == [
        cs.ApproveNodeRequest(node_id="n1", fingerprint=FP, cluster="default")
    ]


def test_revoke_says_the_node_is_lost(cluster: tuple[Cluster, dict[str, str]]) -> None:
    service, env = cluster
    result = qm(env, "node", "revoke", "n1")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        "revoked node n1: its events are refused from now on, and it is lost"
    )
    assert service.requests == [cs.RevokeNodeRequest(node_id="n1")]


def test_a_refusal_is_one_error_line_and_a_failing_exit(
    cluster: tuple[Cluster, dict[str, str]],
) -> None:
    service, env = cluster
    why = "no node 'n9' is pending: `qm node pending` lists those that are"
    service.refuse = (grpc.StatusCode.NOT_FOUND, why)
    result = qm(env, "node", "approve", "n9")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: NOT_FOUND: {why}"
    service.refuse = (grpc.StatusCode.PERMISSION_DENIED, "bob may not revoke nodes")
    result = qm(env, "node", "revoke", "n1")
    assert result.exit_code == 1 and "PERMISSION_DENIED" in result.stderr


def test_an_age_is_rounded_as_it_grows() -> None:
    now = 1_760_000_000.0

    def at(age_s: int) -> Timestamp:
        return Timestamp(seconds=int(now) - age_s)

    assert render.ago(at(5), now) == "5s ago"
    assert render.ago(at(3 * 3600 + 125), now) == "3h2m ago"
    assert render.ago(at(2 * 86400 + 3 * 3600 + 59), now) == "2d3h ago"
    assert render.ago(Timestamp(), now) == "-"
    assert "replaces an approved key" in text(
        render.pending_nodes_table([pending_node("n1", replaces_key=True)], time.time())
    )
