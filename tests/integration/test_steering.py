"""Steering by hand through the real stack: holding jobs back, cordoning and draining nodes."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import cluster_service_pb2_grpc, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.core import simulated
from tests.integration.conftest import eventually, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit
from tests.integration.test_logs import qm

NODE = "sim-0"  # the stack's one A100 node (simulated)


@pytest.fixture
def cluster(stack: Stack) -> Iterator[cluster_service_pb2_grpc.ClusterServiceStub]:
    stub = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel())
    yield stub
    # Whatever a test did, the node goes back to scheduling for the tests after it.
    stub.UncordonNode(cs.UncordonNodeRequest(node_id=NODE), metadata=stack.auth("carol"))


def job(stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str) -> types_pb2.Job:
    request = js.GetJobRequest(job_id=job_id)
    return jobs.GetJob(request, metadata=stack.auth("alice"), timeout=30).job


def node(stack: Stack, cluster: cluster_service_pb2_grpc.ClusterServiceStub) -> types_pb2.Node:
    nodes = cluster.ListNodes(cs.ListNodesRequest(), metadata=stack.auth("alice"), timeout=30)
    return next(n for n in nodes.nodes if n.inventory.node_id == NODE)


def test_a_held_job_starts_only_once_released(
    stack: Stack,
    jobs: js_grpc.JobServiceStub,
    cluster: cluster_service_pb2_grpc.ClusterServiceStub,
) -> None:
    cordoned = qm(stack, "carol", "node", "cordon", NODE)
    assert cordoned.returncode == 0, cordoned.stderr
    eventually(lambda: node(stack, cluster).cordoned, what=f"{NODE} to show cordoned")
    job_id = submit(
        stack, jobs, gpus=8, gpu_type="A100", command=["train"], env={simulated.SECONDS: "0.2"}
    )
    eventually(lambda: job(stack, jobs, job_id).state == types_pb2.JOB_STATE_PENDING)
    held = qm(stack, "alice", "hold", job_id)
    assert held.returncode == 0, held.stderr
    eventually(lambda: job(stack, jobs, job_id).held, what=f"{job_id} to show held")
    assert qm(stack, "carol", "node", "uncordon", NODE).returncode == 0
    eventually(lambda: not node(stack, cluster).cordoned, what=f"{NODE} back")
    reason = eventually(lambda: job(stack, jobs, job_id).reason.startswith("held by alice"))
    assert reason and job(stack, jobs, job_id).state == types_pb2.JOB_STATE_PENDING
    assert qm(stack, "alice", "release", job_id).returncode == 0
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_FINISHED


def test_a_drain_requeues_what_ran_there_and_it_runs_again_once_uncordoned(
    stack: Stack,
    jobs: js_grpc.JobServiceStub,
    cluster: cluster_service_pb2_grpc.ClusterServiceStub,
) -> None:
    job_id = submit(
        stack, jobs, gpus=8, gpu_type="A100", command=["train"], env={simulated.SECONDS: "600"}
    )
    eventually(lambda: job(stack, jobs, job_id).state == types_pb2.JOB_STATE_RUNNING)
    drained = qm(stack, "carol", "node", "drain", NODE)
    assert drained.returncode == 0, drained.stderr
    assert f"{NODE} drained: nothing runs there" in drained.stdout
    requeued = eventually(
        lambda: (j := job(stack, jobs, job_id)).state == types_pb2.JOB_STATE_PENDING and j,
        what=f"{job_id} requeued",
    )
    assert requeued.attempts >= 1 and not node(stack, cluster).running
    cluster.UncordonNode(cs.UncordonNodeRequest(node_id=NODE), metadata=stack.auth("carol"))
    again = eventually(
        lambda: (j := job(stack, jobs, job_id)).state == types_pb2.JOB_STATE_RUNNING and j,
        what=f"{job_id} to run again",
    )
    assert again.attempts == 2
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))
    wait_for_end(stack, jobs, job_id)


def test_only_operators_cordon_and_only_the_jobs_own_user_or_manager_holds(
    stack: Stack,
    jobs: js_grpc.JobServiceStub,
    cluster: cluster_service_pb2_grpc.ClusterServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        cluster.CordonNode(cs.CordonNodeRequest(node_id=NODE), metadata=stack.auth("alice"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # Waits for ever: a simulated run larger than the cluster (one whose command must
    # run would be refused at submission: larger than any node).
    never = {simulated.SECONDS: "1"}
    job_id = submit(stack, jobs, allocation="nlp", gpus=64, command=["true"], env=never)
    with pytest.raises(grpc.RpcError) as refused:  # bob sees nlp's jobs but manages none
        jobs.HoldJob(js.HoldJobRequest(job_id=job_id), metadata=stack.auth("bob"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    running = qm(stack, "alice", "release", job_id)
    assert running.returncode == 1 and "is not held" in running.stderr
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))


def test_an_update_gives_a_waiting_job_what_it_needs_to_start(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    script = "print('ran')"
    # A simulated run may ask for more than any node (a command that must run is refused).
    job_id = submit(
        stack, jobs, gpus=16, gpu_type="H100", command=["python3", "-c", script],
        env={simulated.SECONDS: "0.2"},
    )  # fmt: skip
    eventually(lambda: "only 8 such GPUs" in job(stack, jobs, job_id).reason)
    updated = qm(stack, "alice", "update", job_id, "--gpus", "1")
    assert updated.returncode == 0, updated.stderr
    assert wait_for_end(stack, jobs, job_id).spec.gpus == 1
    again = qm(stack, "alice", "update", job_id, "--gpus", "2")
    assert again.returncode == 1 and "only a batch job that waits can be updated" in again.stderr
