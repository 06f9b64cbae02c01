"""The agent serves its task logs to admission's reader: which tasks of a job it kept, and
one task's log at a time, never a file outside the job's."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from qm.v1 import events_pb2, logs_pb2

from services.node_agent.logserver import NodeLogServicer
from services.node_agent.tasklogs import TaskLogs
from tests.unit.services.admission.doubles import KEYS, Aborted, Context


@pytest.fixture
def servicer(tmp_path: Path) -> NodeLogServicer:
    logs = TaskLogs(tmp_path / "tasks")
    for task_id, text in (("j-1/0", b"first\n"), ("j-1/1", b"second\n"), ("j-2/0", b"other\n")):
        job_id = task_id.split("/")[0]
        sink = logs.open(events_pb2.TaskPlaced(job_id=job_id, task_id=task_id, node_id="n"), None)
        sink.write(text)
        sink.close()
    return NodeLogServicer(
        logs, lambda task_id: task_id == "j-1/1", keys=KEYS, clients=frozenset({"svc-log-reader"})
    )


async def read(servicer: NodeLogServicer, job_id: str, task_id: str, user: str = "") -> bytes:
    request = logs_pb2.ReadTaskLogRequest(job_id=job_id, task_id=task_id)
    context = Context(user or "svc-log-reader")
    return b"".join(
        [piece.data async for piece in servicer.ReadTaskLog(request, context)]  # type: ignore[arg-type]
    )


async def test_the_agent_lists_the_jobs_tasks_and_which_still_run(
    servicer: NodeLogServicer,
) -> None:
    request = logs_pb2.ListTaskLogsRequest(job_id="j-1")
    listed = await servicer.ListTaskLogs(request, Context("svc-log-reader"))  # type: ignore[arg-type]
    assert sorted((t.task_id, t.node_id, t.running) for t in listed.tasks) == [
        ("j-1/0", "n", False),
        ("j-1/1", "n", True),
    ]
    assert all(t.started_at.seconds > 0 for t in listed.tasks)


async def test_each_task_reads_as_its_own_and_only_a_task_of_the_job_asked(
    servicer: NodeLogServicer,
) -> None:
    assert await read(servicer, "j-1", "j-1/0") == b"first\n"
    assert await read(servicer, "j-1", "j-1/1") == b"second\n"
    for task_id in ("j-2/0", "../j-2/0", "j-1"):
        with pytest.raises(Aborted) as refused:
            await read(servicer, "j-1", task_id)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_only_admissions_reader_reads(servicer: NodeLogServicer) -> None:
    with pytest.raises(Aborted) as refused:
        await read(servicer, "j-1", "j-1/0", user="alice")
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
