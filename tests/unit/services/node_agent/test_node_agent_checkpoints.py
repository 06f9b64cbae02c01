"""A task's checkpoints on a real process: the warning signal before SIGTERM, a save cutting
the warning short, and one checkpoint folder for every attempt of a job."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.events.wire_time import duration
from services.node_agent.checkpoints import StopWarning, warning_of
from services.node_agent.executors import ProcessExecution
from tests.unit.services.node_agent.doubles import process_executor, task_log

# Says when it got USR1 and TERM; on USR1 it saves (touches QM_CHECKPOINT_SAVED) if told.
TRAPS = """
import os, signal, sys, time
def said(name, save):
    def handler(signum, frame):
        print(name, time.monotonic(), flush=True)
        if save:
            open(os.environ["QM_CHECKPOINT_SAVED"], "w").close()
        if name == "term":
            sys.exit(0)
    return handler
signal.signal(signal.SIGUSR1, said("usr1", sys.argv[1] == "save"))
signal.signal(signal.SIGTERM, said("term", False))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def placed(task_id: str, *command: str) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="job-1",
        task_id=task_id,
        node_id="n0",
        gpu_indices=[0],
        spec=types_pb2.JobSpec(command=command, resumable=True),
    )


async def trapping(folder: Path, save: bool) -> ProcessExecution:
    task = placed("job-1/0", sys.executable, "-c", TRAPS, "save" if save else "no")
    execution = await process_executor(folder, grace_s=5).start(task)
    log = task_log(folder)
    while not log.exists() or "ready" not in log.read_text().split():
        await asyncio.sleep(0.02)
    return execution


def said(folder: Path) -> dict[str, float]:
    lines = [line.split() for line in task_log(folder).read_text().splitlines()]
    return {words[0]: float(words[1]) for words in lines if len(words) == 2}


async def test_the_warning_signal_comes_its_time_before_sigterm(tmp_path: Path) -> None:
    execution = await trapping(tmp_path, save=False)
    await execution.stop(warning=StopWarning(signal.SIGUSR1, 1.0))
    assert await execution.wait() == 0  # its TERM handler exits 0
    times = said(tmp_path)
    # Its time, less what the two clocks allow: asyncio may fire a timer up to its clock's
    # resolution early, and a loaded machine may run the USR1 handler late (CI saw 0.9988 s).
    assert times["term"] - times["usr1"] >= 0.95


async def test_a_task_that_saves_after_its_warning_is_stopped_at_once(tmp_path: Path) -> None:
    execution = await trapping(tmp_path, save=True)
    began = time.monotonic()
    await execution.stop(warning=StopWarning(signal.SIGUSR1, 60.0))
    await execution.wait()
    assert time.monotonic() - began < 10
    assert set(said(tmp_path)) == {"usr1", "term"}


async def test_every_attempt_of_a_job_has_the_same_checkpoint_folder(tmp_path: Path) -> None:
    executor = process_executor(tmp_path, checkpoints=True)
    save = "import os; open(os.environ['QM_CHECKPOINT_DIR'] + '/step', 'w').write('7')"
    first = await executor.start(placed("job-1/0", sys.executable, "-c", save))
    assert await first.wait() == 0
    first.cleanup(may_return=True)  # preempted and requeued: it may come back
    show = "import os; print(open(os.environ['QM_CHECKPOINT_DIR'] + '/step').read())"
    second = await executor.start(placed("job-1/1", sys.executable, "-c", show))
    assert await second.wait() == 0
    assert task_log(tmp_path, task_id="job-1/1").read_text().splitlines()[-1] == "7"
    second.cleanup(may_return=False)  # the job ended: its checkpoints go with it
    await executor.close()
    assert not (tmp_path / "checkpoints" / "job-1").exists()


@pytest.mark.parametrize(
    ("name", "seconds", "expected"),
    [
        ("USR1", 20.0, StopWarning(signal.SIGUSR1, 20.0)),
        ("", 20.0, None),
        ("KILL", 20.0, None),  # no job may ask for it
        ("USR1", 0.0, None),
        ("USR1", -3.0, None),
        ("USR1", 1e12, None),
    ],
)
def test_a_stops_warning_is_read_as_no_job_could_misuse_it(
    name: str, seconds: float, expected: StopWarning | None
) -> None:
    request = events_pb2.TaskStopRequested(warn_signal=name, warn_for=duration(seconds))
    assert warning_of(request) == expected
