from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import simulated
from libs.core.simulated import SimulatedRun
from libs.events.wire_time import duration_ms
from services.node_agent import keeper
from services.node_agent.executors import (
    ProcessExecution,
    SimulatedExecutor,
    task_environment,
)
from services.node_agent.launch import LaunchError
from tests.unit.services.node_agent.doubles import process_executor, task_log


def placed(
    *command: str,
    gpus: tuple[int, ...] = (0,),
    env: dict[str, str] | None = None,
    duration_s: float = 0.0,
    exit_code: int = 0,
) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="job-1",
        task_id="job-1/0",
        node_id="sim-0",
        gpu_indices=gpus,
        spec=types_pb2.JobSpec(
            command=command,
            env=(env or {}) | simulated.to_env(SimulatedRun(duration_s, exit_code)),
        ),
    )


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_task_environment_puts_the_agent_last() -> None:
    task = placed("true", gpus=(2, 5), env={"FOO": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    env = task_environment({"PATH": "/bin", "FOO": "0"}, task)
    assert env == {
        "PATH": "/bin",
        "FOO": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "2,5",
        "QM_JOB_ID": "job-1",
        "QM_TASK_ID": "job-1/0",
        "QM_RESTART_COUNT": "0",
    }


def test_an_array_element_is_told_its_array_its_index_and_their_number() -> None:
    task = placed("true", env={"QM_ARRAY_INDEX": "99"})  # the agent's word is last
    task.job_id, task.task_id = "a-1f_4", "a-1f_4/0"
    task.spec.array.index, task.spec.array.count = 4, 10
    env = task_environment({}, task)
    assert (env["QM_ARRAY_ID"], env["QM_ARRAY_INDEX"], env["QM_ARRAY_COUNT"]) == ("a-1f", "4", "10")


async def test_process_exit_code_is_reported(tmp_path: Path) -> None:
    execution = await process_executor(tmp_path).start(placed(*python("import sys; sys.exit(3)")))
    assert execution.pid > 0
    assert await execution.wait() == 3


async def test_process_sees_its_gpus_and_ids_and_each_attempt_has_its_own_log(
    tmp_path: Path,
) -> None:
    code = (
        "import os, sys; e = os.environ; "
        "print(e['CUDA_VISIBLE_DEVICES'], e['QM_JOB_ID'], e['QM_TASK_ID'], e['EXTRA'], "
        "flush=True); "
        "print('oops', file=sys.stderr)"
    )
    executor = process_executor(tmp_path)
    task = placed(*python(code), gpus=(1, 3), env={"EXTRA": "yes"})
    assert await (await executor.start(task)).wait() == 0
    task.task_id = "job-1/1"  # the job's second attempt
    assert await (await executor.start(task)).wait() == 0
    for attempt in ("job-1/0", "job-1/1"):
        lines = task_log(tmp_path, task_id=attempt).read_text().splitlines()
        assert lines[0].startswith(f"--- task {attempt} on GPUs [1,3]: ")
        assert sorted(lines[1:]) == sorted([f"1,3 job-1 {attempt} yes", "oops"])


async def test_stop_terminates_a_sleeping_process(tmp_path: Path) -> None:
    execution = await process_executor(tmp_path).start(
        placed(*python("import time; time.sleep(60)"))
    )
    began = time.monotonic()
    await execution.stop()
    assert await execution.wait() == -15
    assert time.monotonic() - began < 5


async def ignoring_sigterm(tmp_path: Path, grace_s: float) -> ProcessExecution:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    execution = await process_executor(tmp_path, grace_s=grace_s).start(placed(*python(code)))
    log = task_log(tmp_path)
    # A SIGTERM sent before the handler is in place would end it at once.
    while not log.exists() or "ready" not in log.read_text().splitlines():
        await asyncio.sleep(0.02)
    return execution


async def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    execution = await ignoring_sigterm(tmp_path, grace_s=0.3)
    await execution.stop()
    assert await execution.wait() == -9


async def test_a_stops_grace_shortens_the_executors_never_lengthens_it(tmp_path: Path) -> None:
    execution = await ignoring_sigterm(tmp_path / "short", grace_s=30)
    began = time.monotonic()
    await execution.stop(grace_s=0.2)  # free work preempted: a short grace
    assert await execution.wait() == -9
    assert time.monotonic() - began < 10
    execution = await ignoring_sigterm(tmp_path / "long", grace_s=0.2)
    began = time.monotonic()
    await execution.stop(grace_s=60)
    assert await execution.wait() == -9
    assert time.monotonic() - began < 10


async def test_stop_after_exit_is_harmless(tmp_path: Path) -> None:
    execution = await process_executor(tmp_path).start(placed(*python("pass")))
    assert await execution.wait() == 0
    await execution.stop()
    assert await execution.wait() == 0


@pytest.mark.parametrize(
    ("command", "reason", "exit_code"),
    [
        (("no-such-command-qm",), "command not found: no-such-command-qm", 127),
        ((), "the job has no command to run", 127),
    ],
)
async def test_unstartable_commands_say_why(
    tmp_path: Path, command: tuple[str, ...], reason: str, exit_code: int
) -> None:
    with pytest.raises(LaunchError) as caught:
        await process_executor(tmp_path).start(placed(*command))
    assert (caught.value.reason, caught.value.exit_code) == (reason, exit_code)


async def test_a_file_without_execute_permission_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(LaunchError) as caught:
        await process_executor(tmp_path).start(placed(str(script)))
    assert (caught.value.reason, caught.value.exit_code) == (f"permission denied: {script}", 126)


async def test_a_child_that_dies_before_it_can_say_why_fails_the_task_not_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Popen raises SubprocessError when the child dies between fork and exec with its
    report half written (seen under chaos): the task fails, the agent goes on."""

    async def dies(*args: object, **kwargs: object) -> None:
        raise subprocess.SubprocessError("Bad exception data from child: b'OSError:'")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", dies)
    with pytest.raises(LaunchError) as caught:
        await process_executor(tmp_path).start(placed("true"))
    assert caught.value.exit_code == 126 and "Bad exception data" in caught.value.reason
    assert "not started" in task_log(tmp_path).read_text()


async def test_a_keeper_whose_output_pipes_fail_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second pipe cannot be watched (the keeper is out of descriptors, say): the task
    does not start, the agent hears why, and both pipes and the log are closed."""
    this, made = asyncio.current_task(), list[int]()  # the pipes this launch made
    loop, pipe = asyncio.get_running_loop(), os.pipe
    connect = loop.connect_read_pipe

    def recorded() -> tuple[int, int]:
        ends = pipe()
        if asyncio.current_task() is this:  # not a removal of an earlier test's
            made.extend(ends)
        return ends

    async def second_fails(*args: Any) -> Any:
        if asyncio.current_task() is this and len(made) == 4:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await connect(*args)

    monkeypatch.setattr(os, "pipe", recorded)
    monkeypatch.setattr(loop, "connect_read_pipe", second_fails)
    log = tmp_path / "task.log"
    launch = keeper.Launch(
        argv=["true"], command="true", env={}, identity={}, log_path=str(log),
        log_fd=os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), max_bytes=1024,
        owner=None, status=str(tmp_path / "status"),
    )  # fmt: skip
    reply = io.BytesIO()
    reply.close = lambda: None  # type: ignore[method-assign]  # read back below
    await keeper.keep(launch, reply)
    said = json.loads(reply.getvalue())
    assert said["exit_code"] == 126 and "cannot make the task's output pipes" in said["error"]
    assert len(made) == 4
    for fd in [*made, launch.log_fd]:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


def open_files() -> set[str]:
    """What this process has open (the listing's own descriptor is gone once read)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


async def test_simulated_task_runs_for_its_duration_and_exits_as_told() -> None:
    began = time.monotonic()
    execution = await SimulatedExecutor().start(placed(duration_s=0.2, exit_code=4))
    assert execution.pid == 0
    assert await execution.wait() == 4
    assert 0.15 < time.monotonic() - began < 2


async def test_stopping_a_simulated_task_ends_it_with_sigterm() -> None:
    execution = await SimulatedExecutor().start(placed(duration_s=60))
    waiting = asyncio.create_task(execution.wait())
    await asyncio.sleep(0.05)
    await execution.stop()
    assert await asyncio.wait_for(waiting, 1) == -15


def serving_task(model_mb: float = 5720, run_ms: float = 200) -> events_pb2.TaskPlaced:
    task = placed("true", gpus=(3,), duration_s=60)
    task.serving.CopyFrom(
        events_pb2.ServingTask(
            name="translate", model="OPT", model_mb=model_mb, run_duration=duration_ms(run_ms)
        )
    )
    return task


def test_a_serving_task_learns_its_model_and_whether_it_is_cached() -> None:
    env = task_environment({}, serving_task(), model_resident=True)
    assert {k: v for k, v in env.items() if k.startswith("QM_")} == {
        "QM_JOB_ID": "job-1",
        "QM_TASK_ID": "job-1/0",
        "QM_TASK": "translate",
        "QM_MODEL": "OPT",
        "QM_MODEL_MB": "5720",
        "QM_MODEL_RESIDENT": "1",
    }
    assert task_environment({}, serving_task())["QM_MODEL_RESIDENT"] == "0"
    assert "QM_MODEL" not in task_environment({}, placed("true"))


async def test_a_simulated_serving_task_loads_then_runs_for_run_ms() -> None:
    began = time.monotonic()
    await SimulatedExecutor().load_model(serving_task(), 100)
    assert 0.08 < time.monotonic() - began < 2
    execution = await SimulatedExecutor().start(serving_task(run_ms=100))  # not duration_s
    assert await asyncio.wait_for(execution.wait(), 2) == 0


async def test_a_process_loads_its_model_itself(tmp_path: Path) -> None:
    began = time.monotonic()
    await process_executor(tmp_path).load_model(serving_task(), 60_000)
    assert time.monotonic() - began < 1


async def test_a_task_without_a_usable_home_starts_in_its_jobs_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It writes there, finds it as HOME and TMPDIR, and Python does not buffer its output."""
    monkeypatch.setenv("HOME", "/nonexistent")
    code = (
        "import os; e = os.environ; open('probe', 'w').write('ok'); "
        "print(os.getcwd(), e['HOME'], e['TMPDIR'], e['PYTHONUNBUFFERED'], open('probe').read())"
    )
    executor = process_executor(tmp_path)
    execution = await executor.start(placed(*python(code)))
    assert await execution.wait() == 0
    scratch = tmp_path / "scratch" / "job-1"
    printed = task_log(tmp_path).read_text().splitlines()[1]
    assert printed == f"{scratch} {scratch} {scratch} 1 ok"
    execution.cleanup(may_return=False)
    await executor.close()  # the folder's removal runs in the background: until done
    assert not scratch.exists()


async def test_a_job_that_sets_pythonunbuffered_keeps_its_own(tmp_path: Path) -> None:
    code = "import os; print(repr(os.environ['PYTHONUNBUFFERED']))"
    task = placed(*python(code), env={"PYTHONUNBUFFERED": ""})
    assert await (await process_executor(tmp_path).start(task)).wait() == 0
    assert task_log(tmp_path).read_text().splitlines()[1] == "''"


async def test_python_output_reaches_the_log_as_it_is_printed(tmp_path: Path) -> None:
    """print() without flush: without PYTHONUNBUFFERED a pipe holds it until the end."""
    execution = await process_executor(tmp_path).start(
        placed(*python("import time; print('early'); time.sleep(60)"))
    )
    log = task_log(tmp_path)
    async with asyncio.timeout(5):
        while "early" not in log.read_text().splitlines():
            await asyncio.sleep(0.02)
    await execution.stop()
    assert await execution.wait() == -15
