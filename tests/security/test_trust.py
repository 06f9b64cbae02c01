"""Trust inside the log, on the real stack: what a node agent's own Kafka account and its
own key can write, placement refuses unless it is that node's to say.

The attacker here holds everything one GPU node holds: the ``node-agent`` principal's
password and that node's private key. Each forged record is refused by placement with
the reason (``InputRefused.trust``), parked on the dead-letter topic, and never folded:
nothing is placed or run for it, and the audit replays the same refusals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf.message import Message
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.bus import EventProducer, KafkaBus, load_topic_config
from libs.bus.deadletter import REASON
from libs.events import decode, event_type, new_envelope
from libs.trust import SigningKey
from tests.integration.conftest import (
    assert_audit_reproduces,
    eventually,
    read_topic,
    until_running,
)
from tests.integration.stack import OPERATOR, Stack
from tests.integration.test_job_lifecycle import submit
from tests.security.conftest import Suite

# An agent of two more nodes: one an operator approves (then revokes), one never.
EXTRA = {
    "nodes": [
        {"node_id": node_id, "gpu_type": "A100", "gpu_count": 2, "gpu_memory_gib": 40,
         "executor": "simulated"}
        for node_id in ("trust-approved", "trust-pending")
    ]
}  # fmt: skip


def _node_key(stack: Stack, node_id: str) -> SigningKey:
    return SigningKey.of_node(node_id, Path(stack.env["QM_NODE_KEY_DIR"]) / f"{node_id}.key")


def _send(stack: Stack, payload: Message, key: SigningKey | None) -> str:
    """Write one record as a node agent: its Kafka account, and ``key`` (None: unsigned)."""
    env = new_envelope(payload, producer="node-agent/forger", cluster="default")
    topic = load_topic_config(Path(stack.topics_file)).events.name

    async def send() -> None:
        bus = KafkaBus(stack.kafka_settings("node-agent"))
        async with EventProducer(bus, client_id="forger", sealer=key) as producer:
            await producer.send(topic, env)

    asyncio.run(send())
    return env.event_id


def _refusal(stack: Stack, event_id: str) -> events_pb2.InputRefused:
    """Placement's refusal of the input ``event_id``, once it is on the decisions topic."""

    def found() -> events_pb2.InputRefused | None:
        for record in read_topic(stack, "decisions"):
            env = decode(record.value)
            if event_type(env) == "input_refused" and env.input_refused.event_id == event_id:
                return env.input_refused
        return None

    return eventually(found, what=f"placement's refusal of {event_id}")


def _parked(stack: Stack, event_id: str) -> str:
    """The reason the record ``event_id`` was dead-lettered with."""

    def found() -> str | None:
        for record in read_topic(stack, "deadletter"):
            if record.value is not None and decode(record.value).event_id == event_id:
                return dict(record.headers)[REASON].decode()
        return None

    return eventually(found, what=f"{event_id} on the dead-letter topic")


def _refused(stack: Stack, payload: Message, key: SigningKey | None, code: str) -> str:
    event_id = _send(stack, payload, key)
    refusal = _refusal(stack, event_id)
    assert refusal.trust == code, refusal
    assert f"untrusted ({code})" in _parked(stack, event_id)
    return refusal.reason


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> Iterator[Stack]:
    """The whole stack, its nodes approved."""
    stack = Stack(tmp_path_factory.mktemp("trust"))
    suite.stacks.append(stack)
    try:
        stack.up()
        stack.wait_registered()
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def jobs(stack: Stack) -> js_grpc.JobServiceStub:
    return js_grpc.JobServiceStub(stack.channel())


@pytest.fixture(scope="module")
def running(stack: Stack, jobs: js_grpc.JobServiceStub) -> Iterator[types_pb2.Job]:
    """A job of alice's running on a process node, for the whole module."""
    job_id = submit(stack, jobs, gpu_type="H100", command=["sleep", "600"])
    yield until_running(stack, jobs, job_id)
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))


def _forger(job: types_pb2.Job) -> tuple[str, str]:
    """(the node the job runs on, the other process node: the forger's)."""
    node = job.placements[0].node_id
    return node, "proc-1" if node == "proc-0" else "proc-0"


def test_a_node_cannot_submit_a_job_for_anyone(
    stack: Stack, jobs: js_grpc.JobServiceStub, running: types_pb2.Job
) -> None:
    _, forger = _forger(running)
    key = _node_key(stack, forger)
    spec = types_pb2.JobSpec(user="alice", allocation="vision", gpus=1, command=["id"])
    reason = _refused(
        stack, events_pb2.JobAdmitted(job_id="j-forged", spec=spec), key, "out_of_role"
    )
    assert "node may not write job_admitted: only admission writes it" in reason
    _refused(stack, events_pb2.JobSubmitted(job_id="j-forged-2", spec=spec), key, "out_of_role")
    placed = [
        decode(r.value).task_placed.job_id
        for r in read_topic(stack, "decisions")
        if event_type(decode(r.value)) == "task_placed"
    ]
    assert "j-forged" not in placed and "j-forged-2" not in placed


def test_a_node_cannot_end_a_task_of_another_node(
    stack: Stack, jobs: js_grpc.JobServiceStub, running: types_pb2.Job
) -> None:
    node, forger = _forger(running)
    key, task = _node_key(stack, forger), running.placements[0]
    as_it = events_pb2.TaskFinished(job_id=running.job_id, task_id=task.task_id, node_id=node)
    assert "may report only about itself" in _refused(stack, as_it, key, "out_of_role")
    as_itself = events_pb2.TaskFinished(job_id=running.job_id, task_id=task.task_id, node_id=forger)
    assert f"which runs on {node}" in _refused(stack, as_itself, key, "out_of_role")
    time.sleep(1)  # what a believed report would have ended by now
    job = jobs.GetJob(js.GetJobRequest(job_id=running.job_id), metadata=stack.auth("alice")).job
    assert job.state == types_pb2.JOB_STATE_RUNNING


def test_a_node_cannot_register_under_another_name(stack: Stack, running: types_pb2.Job) -> None:
    node, forger = _forger(running)
    inventory = types_pb2.NodeInventory(
        node_id=node, gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(8)]
    )
    registered = events_pb2.NodeRegistered(inventory=inventory, incarnation="stolen")
    _refused(stack, registered, _node_key(stack, forger), "out_of_role")


def test_an_unsigned_record_is_refused(stack: Stack) -> None:
    _refused(stack, events_pb2.ClockTick(), None, "unsigned")


def test_unapproved_and_revoked_nodes_are_refused(stack: Stack) -> None:
    nodes = stack.workdir / "nodes-trust.yaml"
    nodes.write_text(yaml.safe_dump(EXTRA))
    stack.start_instance(
        "node_agent-trust", "node_agent", {}, "--nodes", str(nodes), "--name", "trust"
    )
    approved_at = time.time()
    stack.approve_nodes({"trust-approved"})
    clusters = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel())

    def registered() -> bool:
        """Its agent registered again once approved (its first try was refused)."""
        listed = clusters.ListNodes(
            cluster_service_pb2.ListNodesRequest(), metadata=stack.auth("alice")
        )
        return any(
            node.inventory.node_id == "trust-approved"
            and node.approved_key
            and node.registered_at.seconds >= int(approved_at)
            for node in listed.nodes
        )

    eventually(registered, what="the approved node to register")
    beat = events_pb2.NodeHeartbeat(node_id="trust-pending")
    reason = _refused(stack, beat, _node_key(stack, "trust-pending"), "unapproved_node")
    assert "qm node approve trust-pending" in reason

    with pytest.raises(grpc.RpcError) as denied:  # only operators revoke
        clusters.RevokeNode(
            cluster_service_pb2.RevokeNodeRequest(node_id="trust-approved"),
            metadata=stack.auth("alice"),
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    clusters.RevokeNode(
        cluster_service_pb2.RevokeNodeRequest(node_id="trust-approved"),
        metadata=stack.auth(OPERATOR),
    )

    def lost() -> bool:
        return any(
            event_type(env := decode(r.value)) == "node_lost"
            and env.node_lost.node_id == "trust-approved"
            for r in read_topic(stack, "decisions")
        )

    eventually(lost, what="the revoked node to be lost")
    beat = events_pb2.NodeHeartbeat(node_id="trust-approved")
    _refused(stack, beat, _node_key(stack, "trust-approved"), "revoked_key")
    stack.stop("node_agent-trust")


def test_the_audit_replays_every_refusal(stack: Stack) -> None:
    refused = [
        decode(r.value)
        for r in read_topic(stack, "decisions")
        if event_type(decode(r.value)) == "input_refused" and decode(r.value).input_refused.trust
    ]
    assert len(refused) >= 8
    assert_audit_reproduces(stack, at_least=len(refused))
