"""A restarted agent takes back what its keepers still run: a task goes on, its output
too, and the next agent reads how it ended; a node whose tasks cannot all be taken back
gets a new incarnation and what its records name is killed."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

from qm.v1 import events_pb2, types_pb2

from services.node_agent import keeper
from services.node_agent.orphans import TaskRecords, adopt, record_of, start_time
from tests.unit.services.node_agent.doubles import process_executor, task_log

COUNTS = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n"


def placed(task_id: str = "job-1/0", node: str = "n0", *command: str) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="job-1",
        task_id=task_id,
        node_id=node,
        gpu_indices=[0],
        spec=types_pb2.JobSpec(command=command or (sys.executable, "-c", COUNTS)),
    )


async def test_a_task_outlives_its_agent_and_the_next_one_reads_how_it_ended(
    tmp_path: Path,
) -> None:
    records = TaskRecords(tmp_path / "state")
    records.keep_incarnations({"n0": "one"})
    first = await process_executor(tmp_path, records=records).start(placed())
    # The agent is gone: a new one finds the task on record, its keeper running it.
    taken = adopt(records, ["n0"], ["n0"])
    assert taken.incarnations == {"n0": "one"}  # placement keeps counting its task
    [record] = taken.records
    assert record.task.task_id == "job-1/0" and record.task_pid == first.pid
    again = await process_executor(tmp_path, records=records).adopt(record)
    assert await again.wait() == 0
    assert task_log(tmp_path).read_text().splitlines()[1:] == ["0", "1", "2"]
    again.cleanup(may_return=False)  # its end reported
    assert records.load() == []


async def test_a_task_that_ended_while_no_agent_ran_is_read_back(tmp_path: Path) -> None:
    records = TaskRecords(tmp_path / "state")
    records.keep_incarnations({"n0": "one"})
    first = await process_executor(tmp_path, records=records).start(
        placed("job-1/0", "n0", sys.executable, "-c", "raise SystemExit(3)")
    )
    while first.kept.alive():
        await asyncio.sleep(0.05)
    [record] = adopt(records, ["n0"], ["n0"]).records
    assert await (await process_executor(tmp_path, records=records).adopt(record)).wait() == 3


def test_a_node_whose_tasks_cannot_all_be_taken_back_starts_anew(tmp_path: Path) -> None:
    records = TaskRecords(tmp_path / "state")
    records.keep_incarnations({"n0": "one", "n1": "one", "sim": "one"})
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        # n0: a task whose keeper died without a word (and left the task running).
        gone = record_of(
            placed("job-1/0", "n0"),
            keeper_pid=orphan.pid,
            keeper_started="0",  # not the start of whatever runs under that pid now
            task_pid=orphan.pid,
            status=tmp_path / "never",
        )
        records.write("job-1/0", gone)
        records.mark_serving("n1")  # n1 queued workflow tasks: the agent alone knew them
        taken = adopt(records, ["n0", "n1"], ["n0", "n1", "sim"])
        assert taken.records == ()
        assert all(taken.incarnations[n] != "one" for n in ("n0", "n1", "sim"))
        assert records.incarnations() == taken.incarnations  # for the agent after this one
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert records.load() == [] and not records.serves("n1")
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


def test_a_recorded_pid_now_used_by_another_process_is_spared(tmp_path: Path) -> None:
    records = TaskRecords(tmp_path / "state")
    record = record_of(
        placed(), keeper_pid=os.getpid(), keeper_started="0", task_pid=os.getpid(),
        status=tmp_path / "never",
    )  # fmt: skip
    # This process has the pid now: it started at another time than the task did.
    records.write("job-1/0", dataclasses.replace(record, task_started="0"))
    adopt(records, ["n0"], ["n0"])  # no incarnation on record: not taken back, dropped
    assert records.load() == [] and start_time(os.getpid()) is not None


async def test_a_task_whose_agent_died_before_hearing_it_started_is_not_kept(
    tmp_path: Path,
) -> None:
    """No agent recorded it, and the next one starts its placement again: the keeper
    kills it rather than keep a task nobody follows."""

    class Gone(io.BytesIO):
        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    log = tmp_path / "task.log"
    launch = keeper.Launch(
        argv=[sys.executable, "-c", "import time; time.sleep(60)"], command="python",
        env={}, identity={}, log_path=str(log),
        log_fd=os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), max_bytes=1024,
        owner=None, status=str(tmp_path / "status"),
    )  # fmt: skip
    await asyncio.wait_for(keeper.keep(launch, Gone()), 10)  # not the task's 60 s
    assert not (tmp_path / "status").exists()
