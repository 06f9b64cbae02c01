"""What `qm logs` says when there is no output to stream."""

from __future__ import annotations

import grpc
import pytest
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from services.admission.servicer import JobServicer
from tests.unit.services.admission.doubles import Aborted, Context, Projector, memory_log, servicer


def placed_job(state: types_pb2.JobState.ValueType, node: str = "") -> types_pb2.Job:
    job = types_pb2.Job(job_id="j-1", state=state, reason="needs 8×GPU")
    job.spec.user, job.spec.allocation = "alice", "team-a"
    if node:
        job.placements.add(task_id="j-1/0", node_id=node)
    return job


async def stream(service: JobServicer, follow: bool = False) -> Aborted:
    with pytest.raises(Aborted) as refused:
        request = js.StreamLogsRequest(job_id="j-1", follow=follow)
        async for _ in service.StreamLogs(request, Context("alice")):  # type: ignore[arg-type]
            pass
    return refused.value


@pytest.mark.parametrize(
    ("job", "nodes", "says"),
    [
        (placed_job(types_pb2.JOB_STATE_PENDING), [], "has not started yet (PENDING: needs 8"),
        (placed_job(types_pb2.JOB_STATE_CANCELLED), [], "never ran (CANCELLED"),
        (
            placed_job(types_pb2.JOB_STATE_LOST, "n1"),
            [types_pb2.Node(inventory=types_pb2.NodeInventory(node_id="n1"), lost=True,
                            log_endpoint="10.0.0.1:50061")],
            "is on node(s) n1, which were lost",
        ),
        (
            placed_job(types_pb2.JOB_STATE_FINISHED, "n1"),
            [types_pb2.Node(inventory=types_pb2.NodeInventory(node_id="n1"))],
            "serve no task logs",
        ),
    ],
)  # fmt: skip
async def test_no_output_to_stream_is_explained(
    job: types_pb2.Job, nodes: list[types_pb2.Node], says: str
) -> None:
    async with servicer(memory_log(), projector=Projector(nodes)) as service:  # type: ignore[arg-type]
        service.journal.remember(job)
        refused = await stream(service)
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION and says in refused.details
