"""How a placed task runs: as a real process on its GPUs, or simulated by a timer.

Both report an exit code the way ``subprocess`` does: negative when a signal ended
the task, so a stopped task reads -15 (SIGTERM) or -9 (SIGKILL) under either executor.

A workflow task (``TaskPlaced.serving``) needs its model on its GPU. The agent keeps
the books of each GPU's model cache and calls ``load_model`` before ``start`` when the
model is not resident: the simulated executor waits the load time; a process loads its
model itself as it starts (told by ``QM_MODEL``, ``QM_MODEL_MB`` and
``QM_MODEL_RESIDENT``), so its ``load_model`` returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qm.v1 import events_pb2

from libs.core import simulated
from libs.core.decisions import stop_grace
from libs.events import wire_time
from services.node_agent.cgroups import Confinement, spawn_prefix
from services.node_agent.orphans import ProcessLedger
from services.node_agent.sandbox import Account, Refused, Sandbox
from services.node_agent.secrets import MissingSecret, SecretStore
from services.node_agent.tasklogs import DEFAULT_MAX_BYTES, OutputPipe, TaskLog, log_file_name
from services.runtime import cancel_and_wait

# How long a task's output may take to reach its log after the task ended.
OUTPUT_DRAIN_S = 2.0


class LaunchError(Exception):
    """The task could not start; exit codes as in a shell: 127 not found, 126 not runnable."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class Execution(Protocol):
    """One started task."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int:
        """Wait for the task to end; return its exit code."""
        ...

    async def stop(self, grace_s: float = 0.0) -> None:
        """Ask the task to end, and make sure it does, after at most ``grace_s`` (0: the
        executor's grace; ``stop_grace``); ``wait`` then returns its exit code."""
        ...


class Executor(Protocol):
    async def start(
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False
    ) -> Execution:
        """Start the task, or raise LaunchError saying why it could not start.

        ``model_resident``: a serving task's model is already on its GPU.
        """
        ...

    async def load_model(self, task: events_pb2.TaskPlaced, load_ms: float) -> None:
        """Bring a serving task's model onto its GPU before ``start``; cancellable."""
        ...


def task_environment(
    base: Mapping[str, str],
    task: events_pb2.TaskPlaced,
    *,
    model_resident: bool = False,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The sandbox's ``base`` (a few of the agent's variables), then the job's extras and
    its ``secrets`` (from the node's store), then what the agent decides.

    The agent's own variables come last so that a job cannot widen its GPU set. CUDA
    numbers GPUs fastest first unless told otherwise; NVML, whose indices the inventory
    and the utilisation sampler use, numbers them by PCI bus. A serving task also gets
    ``QM_TASK`` (its name in the workflow), ``QM_MODEL``, ``QM_MODEL_MB`` and
    ``QM_MODEL_RESIDENT`` ("1" when the agent's books say the model is cached, else "0").
    The simulated executor's entries (``QM_SIMULATED_*``) are for it alone.
    """
    env = {
        **base,
        **{k: v for k, v in task.spec.env.items() if not k.startswith(simulated.PREFIX)},
        **(secrets or {}),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in task.gpu_indices),
        "QM_JOB_ID": task.job_id,
        "QM_TASK_ID": task.task_id,
    }
    if task.HasField("serving"):
        env |= {
            "QM_TASK": task.serving.name,
            "QM_MODEL": task.serving.model,
            "QM_MODEL_MB": f"{task.serving.model_mb:g}",
            "QM_MODEL_RESIDENT": "1" if model_resident else "0",
        }
    return env


class ProcessExecutor:
    """Runs ``spec.command`` without a shell, its output appended to its job's log
    (``tasklogs``: ``<log_dir>/<job_id>.log``, at most twice ``log_max_bytes``).

    ``sandbox`` says whose account runs the task and what environment it starts from
    (default: the agent's own account, a clean environment). A task that runs as its
    user's account gets a log only that account reads, a private umask and its home as
    working directory. ``ledger`` records each running task's process group, for the
    next agent to kill if this one dies with its tasks still running.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        grace_s: float = 10.0,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        sandbox: Sandbox | None = None,
        secrets: SecretStore | None = None,
        ledger: ProcessLedger | None = None,
    ) -> None:
        self._log_dir = log_dir
        self._grace_s = grace_s
        self._log_max_bytes = log_max_bytes
        self._sandbox = sandbox or Sandbox.as_agent()
        self._secrets = secrets or SecretStore(None)
        self._ledger = ledger

    async def load_model(self, task: events_pb2.TaskPlaced, load_ms: float) -> None:
        """Nothing to do here: the task loads its model itself when it starts."""

    async def start(
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False
    ) -> ProcessExecution:
        argv = list(task.spec.command)
        if not argv:
            raise LaunchError("the job has no command to run", 127)
        try:
            runs_as = self._sandbox.account_for(task.spec.user)
            secrets = self._secrets.values(task.spec.user, task.spec.secrets)
        except (Refused, MissingSecret) as exc:
            raise LaunchError(str(exc), 126) from None
        log_path = self._log_dir / log_file_name(task.job_id)
        try:
            log = TaskLog(log_path, max_bytes=self._log_max_bytes, owner=runs_as)
        except OSError as exc:
            raise LaunchError(f"cannot open the task log {log_path}: {exc.strerror}", 126) from exc
        confinement = None
        spawned = argv
        if runs_as is not None and self._sandbox.cgroups is not None:
            try:
                confinement = self._sandbox.cgroups.confine(task.task_id, task.gpu_indices)
            except OSError as exc:
                log.close()
                raise LaunchError(f"cannot make the task's cgroup: {exc}", 126) from exc
            spawned = [*spawn_prefix(runs_as.uid, runs_as.gid, confinement), *argv]
        # A header per attempt: a job that is preempted and requeued appends again.
        gpus = ",".join(str(index) for index in task.gpu_indices)
        command = shlex.join(argv).replace("\n", "\\n")  # one line, whatever the script
        log.write(f"--- task {task.task_id} on GPUs [{gpus}]: {command}\n".encode())
        env = task_environment(
            self._sandbox.environment(runs_as),
            task,
            model_resident=model_resident,
            secrets=secrets,
        )
        output = await OutputPipe.into(log, runs_as)
        try:
            process = await _spawn(
                spawned,
                argv[0],
                output.write_fd,
                env,
                _identity(runs_as, switch=confinement is None),
            )
        except LaunchError as exc:
            log.write(f"--- not started: {exc.reason}\n".encode())
            if confinement is not None:
                confinement.release()
            raise
        finally:
            os.close(output.write_fd)  # the task has its copy: EOF once it (and its own) end
        if self._ledger is not None:
            self._ledger.record(process.pid)
        return ProcessExecution(
            process,
            copying=output.copying,
            grace_s=self._grace_s,
            ledger=self._ledger,
            confinement=confinement,
        )


async def _spawn(
    argv: list[str], command: str, output: int, env: dict[str, str], identity: dict[str, Any]
) -> asyncio.subprocess.Process:
    """Start ``argv`` with its stdout and stderr on the ``output`` descriptor;
    ``LaunchError`` naming ``command`` (the task's own, whatever runs before it) when it
    cannot start."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            # Its own process group: stop() reaches the task's children too, and a
            # Ctrl-C meant for the agent does not hit tasks before their grace period.
            start_new_session=True,
            **identity,
        )
    except FileNotFoundError:
        raise LaunchError(f"command not found: {command}", 127) from None
    except PermissionError:
        raise LaunchError(f"permission denied: {command}", 126) from None
    except OSError as exc:
        raise LaunchError(f"cannot run {command}: {exc.strerror}", 126) from None
    except ValueError as exc:  # a NUL in an argument or the environment
        raise LaunchError(f"cannot run {command}: {exc}", 126) from None
    except subprocess.SubprocessError as exc:  # the child died before it could say why
        raise LaunchError(f"cannot run {command}: {exc}", 126) from None


def _identity(runs_as: Account | None, *, switch: bool) -> dict[str, Any]:
    """The subprocess options that make the task its account's: files it creates private
    to it, its home (if it has one) as working directory and, with ``switch``, its
    account with no groups of the agent's (else ``spawn_prefix`` switches, after joining
    the task's cgroups)."""
    if runs_as is None:
        return {}
    home = runs_as.home if os.path.isdir(runs_as.home) else "/"
    options: dict[str, Any] = {"umask": 0o077, "cwd": home}
    if switch:
        options |= {"user": runs_as.uid, "group": runs_as.gid, "extra_groups": []}
    return options


@dataclass(frozen=True)
class ProcessExecution:
    """A task's process, the leader of its own process group; ``copying`` its output into
    its log; ``ledger`` (if any) has it on record until it is reaped."""

    process: asyncio.subprocess.Process
    copying: asyncio.Task[None]
    grace_s: float
    ledger: ProcessLedger | None = None
    confinement: Confinement | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait(self) -> int:
        code = await self.process.wait()
        # What it wrote before it ended is in the pipe still. A process it left behind
        # may hold the pipe open: its output after the task ended is not kept.
        try:
            await asyncio.wait_for(asyncio.shield(self.copying), OUTPUT_DRAIN_S)
        except TimeoutError:
            await cancel_and_wait(self.copying)
        if self.confinement is not None:  # what it left behind goes with its cgroups
            self.confinement.release()
        if self.ledger is not None:
            self.ledger.forget(self.process.pid)
        return code

    async def stop(self, grace_s: float = 0.0) -> None:
        """SIGTERM to the task's process group; SIGKILL if it outlives the grace period
        (``grace_s`` may shorten it, never lengthen it)."""
        if self.process.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), stop_grace(grace_s, self.grace_s))
        except TimeoutError:
            self._signal(signal.SIGKILL)
            await self.process.wait()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
            os.killpg(self.process.pid, sig)


class SimulatedExecutor:
    """Runs nothing: the task "runs" and exits as its job's environment tells
    (``QM_SIMULATED_SECONDS``, ``QM_SIMULATED_EXIT``; ``libs.core.simulated``).

    A serving task runs for its ``serving.run_duration``; loading its model takes ``load_ms``.
    """

    async def load_model(self, task: events_pb2.TaskPlaced, load_ms: float) -> None:
        await asyncio.sleep(max(load_ms, 0.0) / 1000)

    async def start(
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False
    ) -> SimulatedExecution:
        run, _ = simulated.split_env(task.spec.env)
        serving = task.HasField("serving")
        duration_s = wire_time.seconds(task.serving.run_duration) if serving else run.duration_s
        return SimulatedExecution(duration_s, exit_code=run.exit_code)


class SimulatedExecution:
    pid = 0  # no process

    def __init__(self, duration_s: float, *, exit_code: int) -> None:
        self._deadline = asyncio.get_running_loop().time() + max(duration_s, 0.0)
        self._exit_code = exit_code
        self._stopped = asyncio.Event()

    async def wait(self) -> int:
        remaining = self._deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(self._stopped.wait(), max(remaining, 0.0))
        except TimeoutError:
            return self._exit_code
        return -signal.SIGTERM.value

    async def stop(self, grace_s: float = 0.0) -> None:
        self._stopped.set()
