"""A node agent killed with -9: its node is declared lost on the log's clock, its job
ends LOST, and the agent that comes back kills the task it left and serves again."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.events import decode, event_type
from tests.integration.conftest import eventually, read_topic, until_running, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit


def node_of(stack: Stack, node_id: str) -> types_pb2.Node:
    stub = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel())
    nodes = stub.ListNodes(cluster_service_pb2.ListNodesRequest(), metadata=stack.auth("alice"))
    [node] = [n for n in nodes.nodes if n.inventory.node_id == node_id]
    return node


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a parent that is gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_crashed_agent_loses_its_node_and_leaks_nothing(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    sleeper = submit(
        stack,
        jobs,
        gpus=4,
        gpu_type="H100",
        command=["sleep", "120"],
        min_runtime=Duration(seconds=60),
    )
    running = until_running(stack, jobs, sleeper)
    [pid] = [
        env.task_started.pid
        for env in (decode(r.value) for r in read_topic(stack, "events"))
        if event_type(env) == "task_started" and env.task_started.job_id == sleeper
    ]
    killed_at = time.monotonic()
    stack.kill("node_agent")
    assert alive(pid), "the task runs in its own process group: it outlives its agent"

    lost = wait_for_end(stack, jobs, sleeper)
    declared_s = time.monotonic() - killed_at
    assert lost.state == types_pb2.JOB_STATE_LOST, lost
    assert lost.reason.startswith(f"node {running.node_id} lost: no heartbeat for ")
    assert declared_s < 5 + 10
    node = eventually(lambda: (n := node_of(stack, running.node_id)).lost and n, what="lost")
    assert list(node.running) == []
    meanwhile = submit(stack, jobs, gpus=4, gpu_type="H100", command=["true"])

    stack.start_node_agent()  # as a supervisor would: a new incarnation
    eventually(lambda: not alive(pid), what="the orphaned task to be killed")
    eventually(lambda: not node_of(stack, running.node_id).lost, what="the node back up")
    assert wait_for_end(stack, jobs, meanwhile).state == types_pb2.JOB_STATE_FINISHED
    # Cancelling a job that is over is refused as such, not lost in the void.
    with pytest.raises(grpc.RpcError) as refused:
        jobs.CancelJob(js.CancelJobRequest(job_id=sleeper), metadata=stack.auth("alice"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
