from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import simulated
from libs.core.simulated import SimulatedRun
from libs.events.wire_time import duration_ms
from services.node_agent.executors import (
    LaunchError,
    ProcessExecution,
    ProcessExecutor,
    SimulatedExecutor,
    task_environment,
)
from services.node_agent.tasklogs import log_file_name


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
    }


def test_log_file_name_stays_in_the_log_folder() -> None:
    assert log_file_name("job-1") == "job-1.log"
    assert "/" not in log_file_name("../../etc/passwd")
    assert not log_file_name("..hidden").startswith(".")


async def test_process_exit_code_is_reported(tmp_path: Path) -> None:
    execution = await ProcessExecutor(tmp_path).start(placed(*python("import sys; sys.exit(3)")))
    assert execution.pid > 0
    assert await execution.wait() == 3


async def test_process_sees_its_gpus_and_ids_and_logs_to_the_job_file(tmp_path: Path) -> None:
    code = (
        "import os, sys; e = os.environ; "
        "print(e['CUDA_VISIBLE_DEVICES'], e['QM_JOB_ID'], e['QM_TASK_ID'], e['EXTRA'], "
        "flush=True); "
        "print('oops', file=sys.stderr)"
    )
    executor = ProcessExecutor(tmp_path / "logs")
    task = placed(*python(code), gpus=(1, 3), env={"EXTRA": "yes"})
    for _ in range(2):
        assert await (await executor.start(task)).wait() == 0
    lines = (tmp_path / "logs" / "job-1.log").read_text().splitlines()
    assert lines[1:3] == ["1,3 job-1 job-1/0 yes", "oops"]
    assert lines[0].startswith("--- task job-1/0 on GPUs [1,3]: ")
    assert lines[3:] == lines[:3], "a second attempt appends to the same log"


async def test_stop_terminates_a_sleeping_process(tmp_path: Path) -> None:
    execution = await ProcessExecutor(tmp_path).start(
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
    execution = await ProcessExecutor(tmp_path, grace_s=grace_s).start(placed(*python(code)))
    log = tmp_path / "job-1.log"
    # A SIGTERM sent before the handler is in place would end it at once.
    while "ready" not in log.read_text().splitlines():
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
    execution = await ProcessExecutor(tmp_path).start(placed(*python("pass")))
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
        await ProcessExecutor(tmp_path).start(placed(*command))
    assert (caught.value.reason, caught.value.exit_code) == (reason, exit_code)


async def test_a_file_without_execute_permission_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(LaunchError) as caught:
        await ProcessExecutor(tmp_path).start(placed(str(script)))
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
        await ProcessExecutor(tmp_path).start(placed("true"))
    assert caught.value.exit_code == 126 and "Bad exception data" in caught.value.reason
    assert "not started" in (tmp_path / "job-1.log").read_text()


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
    await ProcessExecutor(tmp_path).load_model(serving_task(), 60_000)
    assert time.monotonic() - began < 1
