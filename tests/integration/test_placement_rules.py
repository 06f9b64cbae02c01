"""On the real stack: a job's command runs only where processes run, what no node offers is
refused at submission, and a job is told how it is protected and who preempted it."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from tests.integration.conftest import eventually, until_running, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit

# The session's nodes (tests/integration/stack.py NODES), as a refusal names them.
HERE = "GPU types here: A100 (40 GiB, 8 GPUs, simulated), H100 (80 GiB, 8 GPUs)"


def output(stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str) -> str:
    request = js.StreamLogsRequest(job_id=job_id)
    chunks = jobs.StreamLogs(request, metadata=stack.auth("alice"), timeout=30)
    return b"".join(chunk.data for chunk in chunks).decode()


def test_a_command_runs_where_processes_run_never_on_a_simulated_node(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    # Two parts of four: the simulated A100 node has room for one, so a fit by GPUs alone
    # could put a part there (and it would "finish" without running). The parts go to
    # the two process nodes instead, and each prints.
    job_id = submit(stack, jobs, gpus=8, nodes=2, command=["python3", "-c", "print(42)"])
    job = wait_for_end(stack, jobs, job_id)
    assert job.state == types_pb2.JOB_STATE_FINISHED, job
    assert sorted(p.node_id for p in job.placements) == ["proc-0", "proc-1"]
    assert output(stack, jobs, job_id).splitlines().count("42") == 2


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        ({"gpu_type": "NOPE"}, f"gpu_type: no NOPE node here takes a job's command; {HERE}"),
        ({"gpu_type": "A100"}, f"gpu_type: no A100 node here takes a job's command; {HERE}"),
        (
            {"min_gpu_memory_gib": 96},
            f"min_gpu_memory_gib: no node here has 96 GiB per GPU for a job's command; {HERE}",
        ),
    ],
)
def test_what_no_node_offers_is_refused_at_submission_naming_what_they_do(
    stack: Stack, jobs: js_grpc.JobServiceStub, spec: dict[str, object], refusal: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        submit(stack, jobs, command=["true"], **spec)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"invalid job: {refusal}"


def test_a_preempted_job_is_told_who_took_its_gpus_and_by_which_rule(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    # Free work that resumes: stopping it loses nothing, so charged work takes its GPUs.
    free = submit(
        stack, jobs, gpus=8, nodes=2, gpu_type="H100", command=["sleep", "600"], resumable=True
    )
    assert until_running(stack, jobs, free).protection == types_pb2.PROTECTION_FREE
    paid = submit(
        stack,
        jobs,
        gpus=4,
        gpu_type="H100",
        command=["sleep", "1"],
        min_runtime=Duration(seconds=60),
    )

    def get(job_id: str) -> types_pb2.Job:
        return jobs.GetJob(js.GetJobRequest(job_id=job_id), metadata=stack.auth("alice")).job

    requeued = eventually(
        lambda: (job := get(free)).HasField("preemption") and job.attempts == 1 and job,
        timeout=60,
        what=f"{free} to be preempted",
    )
    assert requeued.preemption == types_pb2.Preemption(
        job_id=paid, allocation="vision", rule=types_pb2.PREEMPTION_RULE_FREE_WORK
    )
    rule = f"preempted for {paid} of vision: free work yields its GPUs to charged work"
    why = jobs.ExplainJob(js.ExplainJobRequest(job_id=free), metadata=stack.auth("alice"))
    assert why.reason.endswith(f"; earlier {rule}")
    started = eventually(
        lambda: (job := get(paid)).HasField("protected_until") and job,
        what=f"{paid} to start protected",
    )
    assert started.protection == types_pb2.PROTECTION_CONTRACT
    assert started.protected_until.seconds == started.started_at.seconds + 60
    assert wait_for_end(stack, jobs, paid).state == types_pb2.JOB_STATE_FINISHED
    jobs.CancelJob(js.CancelJobRequest(job_id=free), metadata=stack.auth("alice"))
    assert wait_for_end(stack, jobs, free).state == types_pb2.JOB_STATE_CANCELLED
