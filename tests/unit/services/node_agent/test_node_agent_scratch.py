"""A job's scratch folder: where its tasks start when their account has no usable home;
kept across the job's attempts (and a workflow's tasks) on the node, removed once the job
ends here."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.config.document import ConfigError
from libs.config.sandbox import SandboxFile, ScratchEntry
from libs.core import simulated
from libs.events.wire_time import duration_ms
from services.node_agent.agent import NodeAgent
from services.node_agent.executors import ProcessExecutor
from services.node_agent.inventory import parse_inventory
from services.node_agent.sandbox import Sandbox
from services.node_agent.scratch import ScratchFolders, may_return
from services.node_agent.tasklogs import TaskLogs
from tests.unit.services.node_agent.doubles import Recorder, delivery, executors, task_log

NODES = parse_inventory(
    {"nodes": [{"node_id": "proc-0", "gpu_type": "H100", "gpu_count": 2, "gpu_memory_gib": 80}]},
    source="test",
)
C = types_pb2


@pytest.mark.parametrize(
    ("stopped", "cause", "resumable", "returns"),
    [
        (False, C.STOP_CAUSE_UNSPECIFIED, True, False),  # finished or failed on its own
        (True, C.STOP_CAUSE_DRAINED, False, True),  # a drained job is always requeued
        (True, C.STOP_CAUSE_PREEMPTED, True, True),
        (True, C.STOP_CAUSE_PREEMPTED, False, False),
        (True, C.STOP_CAUSE_NODE_LOST, True, True),
        (True, C.STOP_CAUSE_NODE_LOST, False, False),
        (True, C.STOP_CAUSE_CANCELLED, True, False),
        (True, C.STOP_CAUSE_UNSPECIFIED, False, True),  # the agent stops: the sweep decides
    ],
)
def test_a_job_may_come_back_when_drained_or_when_resumable_and_preempted_or_lost(
    stopped: bool, cause: types_pb2.StopCause.ValueType, resumable: bool, returns: bool
) -> None:
    task = events_pb2.TaskPlaced(spec=types_pb2.JobSpec(resumable=resumable))
    assert may_return(task, stopped, cause) is returns


@pytest.mark.parametrize("cause", [C.STOP_CAUSE_UNSPECIFIED, C.STOP_CAUSE_CANCELLED])
@pytest.mark.parametrize("stopped", [False, True])
def test_a_workflows_next_task_may_always_come(
    stopped: bool, cause: types_pb2.StopCause.ValueType
) -> None:
    assert may_return(workflow_task("wf-1/a", "true"), stopped, cause)


async def test_a_folder_is_kept_while_the_job_may_come_back_and_removed_once_it_cannot(
    tmp_path: Path,
) -> None:
    folders = ScratchFolders(tmp_path / "scratch", expire_after_s=3600)
    first = await folders.enter("j-1", None)
    assert first == tmp_path / "scratch" / "j-1" and first.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "scratch").stat().st_mode & 0o777 == 0o711
    (first / "cache").mkdir()
    (first / "cache" / "weights").write_text("w")
    (first / "cache").chmod(0o500)  # read-only, as Go's module cache
    folders.leave("j-1", may_return=True)
    assert (await folders.enter("j-1", None) / "cache" / "weights").read_text() == "w"
    await folders.enter("j-1", None)  # a gang's second part on a node here
    folders.leave("j-1", may_return=False)
    await folders.close()
    assert first.exists(), "the job's other task still runs here"
    folders.leave("j-1", may_return=False)
    await folders.close()  # removal runs in the background: until it is done
    assert not first.exists()


async def test_a_new_attempt_waits_for_its_jobs_old_folder_to_go_and_gets_a_new_one(
    tmp_path: Path,
) -> None:
    folders = ScratchFolders(tmp_path / "scratch", expire_after_s=3600)
    old = await folders.enter("j-1", None)
    (old / "left").write_text("by attempt 1")
    folders.leave("j-1", may_return=False)  # its removal starts in the background
    new = await folders.enter("j-1", None)
    assert new == old and new.is_dir() and not (new / "left").exists()
    await folders.close()
    assert new.is_dir(), "the removal was over before the new attempt's folder was made"


async def test_the_sweep_removes_only_old_folders_no_task_uses(tmp_path: Path) -> None:
    folders = ScratchFolders(tmp_path / "scratch", expire_after_s=60)
    for job in ("old", "recent", "running"):
        await folders.enter(job, None)
    folders.leave("old", may_return=True)
    folders.leave("recent", may_return=True)
    long_ago = time.time() - 120
    for job in ("old", "running"):
        os.utime(tmp_path / "scratch" / job, (long_ago, long_ago))
    await folders.sweep()
    assert sorted(os.listdir(tmp_path / "scratch")) == ["recent", "running"]


async def test_a_drained_jobs_next_attempt_finds_its_files_and_its_end_removes_them(
    tmp_path: Path, emitted: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent: attempt 1 writes into its working directory and is drained;
    attempt 2, here again, reads it back there and finishes; then the folder is gone."""
    monkeypatch.setenv("HOME", "/nonexistent")  # the agent's account has no home: scratch
    agent = NodeAgent(NODES, executors=executors(tmp_path), emit=emitted)
    writes = "import time; open('state', 'w').write('step 7'); print('saved'); time.sleep(60)"
    reads = "import os; print(os.getcwd(), open('state').read(), os.environ['TMPDIR'])"
    first = placed("job-1/0", writes)
    await agent.handle(delivery(first))
    while "saved" not in _read(task_log(tmp_path)).splitlines():
        await asyncio.sleep(0.02)
    drain = events_pb2.TaskStopRequested(
        job_id="job-1", task_id="job-1/0", node_id="proc-0", cause=C.STOP_CAUSE_DRAINED
    )
    await agent.handle(delivery(drain, offset=1))
    await emitted.until(1, "task_failed")
    await asyncio.sleep(0.1)
    scratch = tmp_path / "scratch" / "job-1"
    assert (scratch / "state").read_text() == "step 7"
    await agent.handle(delivery(placed("job-1/1", reads), offset=2))
    await emitted.until(1, "task_finished")
    async with asyncio.timeout(5):
        while scratch.exists():
            await asyncio.sleep(0.02)
    printed = task_log(tmp_path, task_id="job-1/1").read_text().splitlines()[1]
    assert printed == f"{scratch} step 7 {scratch}"


async def test_a_workflow_tasks_end_keeps_its_jobs_folder_for_the_next(
    tmp_path: Path, emitted: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ended on its own: a batch job's folder would go, a workflow's stays (the sweep
    removes it once unused), however long the agent waits for removals."""
    monkeypatch.setenv("HOME", "/nonexistent")
    agent = NodeAgent(NODES, executors=executors(tmp_path), emit=emitted)
    await agent.handle(delivery(workflow_task("wf-1/a", "open('out', 'w').write('a')")))
    await emitted.until(1, "task_finished")
    await agent.shutdown()
    assert (tmp_path / "scratch" / "wf-1" / "out").read_text() == "a"


def workflow_task(task_id: str, code: str) -> events_pb2.TaskPlaced:
    task = placed(task_id, code)
    task.job_id = "wf-1"
    task.serving.CopyFrom(
        events_pb2.ServingTask(name=task_id.partition("/")[2], run_duration=duration_ms(5))
    )
    return task


def placed(task_id: str, code: str) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="job-1",
        task_id=task_id,
        node_id="proc-0",
        gpu_indices=[0],
        spec=types_pb2.JobSpec(command=[sys.executable, "-c", code], env={simulated.SECONDS: "0"}),
    )


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.skipif(os.geteuid() != 0, reason="running tasks as nobody needs a root agent")
def test_an_agent_whose_tasks_cannot_reach_the_scratch_folders_says_so_as_it_starts(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "scratch"  # pytest's folders are root's alone
    config = SandboxFile(default="nobody", scratch=ScratchEntry(root=str(closed)))
    executor = ProcessExecutor(
        TaskLogs(tmp_path / "logs"), sandbox=Sandbox(config, os.environ, switch=True)
    )
    with pytest.raises(ConfigError, match=f"account nobody .* cannot reach {closed}"):
        executor.prepare()
