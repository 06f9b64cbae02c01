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

from libs.config.document import ConfigError
from libs.core import simulated
from libs.core.decisions import stop_grace
from libs.events import wire_time
from services.node_agent.cgroups import Confinement, spawn_prefix
from services.node_agent.orphans import ProcessLedger
from services.node_agent.sandbox import Account, Refused, Sandbox
from services.node_agent.scratch import ScratchFolders, may_return
from services.node_agent.secrets import MissingSecret, SecretStore
from services.node_agent.tasklogs import OutputPipes, TaskLogs
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

    def cleanup(self, may_return: bool) -> None:
        """The task has ended and its end is reported: let go of what it used here (its
        job's scratch folder goes with the job's last task here, unless the job
        ``may_return``: ``scratch.may_return``), in the background (``Executor.close``)."""
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

    async def close(self) -> None:
        """The agent stops and its tasks have ended: finish what ``cleanup`` began."""
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
    """Runs ``spec.command`` without a shell, its output in a log of its own (``logs``:
    ``<log_dir>/<job>/<task>.log``, bounded and rotated), in its job's scratch folder or
    its account's home.

    ``sandbox`` says whose account runs the task, what environment it starts from and
    where its job's scratch folder is. A task that runs as its user's account gets a
    log of its account's, a private umask and no group of the agent's. ``ledger``
    records each running task's process group, for the next agent to kill if this one
    dies with its tasks still running.
    """

    def __init__(
        self,
        logs: TaskLogs,
        *,
        sandbox: Sandbox,
        grace_s: float = 10.0,
        secrets: SecretStore | None = None,
        ledger: ProcessLedger | None = None,
    ) -> None:
        self.logs = logs
        self._grace_s = grace_s
        self._sandbox = sandbox
        self._scratch = ScratchFolders(
            Path(sandbox.scratch.root), expire_after_s=sandbox.scratch.expire_after_s
        )
        self._secrets = secrets or SecretStore(None)
        self._ledger = ledger

    def prepare(self) -> None:
        """Make the folders of task logs and scratch folders, as the agent starts;
        ``ConfigError`` if one cannot be made, or an account that runs tasks cannot
        reach the scratch folders."""
        try:
            self.logs.prepare()
            self._scratch.prepare()
        except OSError as exc:
            raise ConfigError(f"node agent: {exc}") from exc
        closed = self._sandbox.closed_to(str(self._scratch.root))
        if closed is not None:
            raise ConfigError(
                f"sandbox: scratch.root: account {closed.name} (uid {closed.uid}) cannot "
                f"reach {self._scratch.root}: a folder above it is closed to it; name a "
                "folder every account that runs tasks can reach, such as /var/tmp/qm-scratch"
            )

    async def load_model(self, task: events_pb2.TaskPlaced, load_ms: float) -> None:
        """Nothing to do here: the task loads its model itself when it starts."""

    async def close(self) -> None:
        await self._scratch.close()

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
        try:
            scratch = await self._scratch.enter(task.job_id, runs_as)
        except OSError as exc:
            raise LaunchError(f"cannot make the job's scratch folder: {exc}", 126) from exc
        try:
            return await self._launch(task, argv, runs_as, scratch, secrets, model_resident)
        except BaseException as exc:
            # A task that cannot start ended on its own; one cut short otherwise (the
            # agent stops) was stopped for a cause the agent does not know.
            stopped = not isinstance(exc, LaunchError)
            self._scratch.leave(task.job_id, may_return=may_return(task, stopped))
            raise

    async def _launch(
        self,
        task: events_pb2.TaskPlaced,
        argv: list[str],
        runs_as: Account | None,
        scratch: Path,
        secrets: dict[str, str],
        model_resident: bool,
    ) -> ProcessExecution:
        try:
            log = self.logs.open(task, runs_as)
        except OSError as exc:
            path = self.logs.path(task.job_id, task.task_id)
            raise LaunchError(f"cannot open the task log {path}: {exc}", 126) from exc
        with contextlib.ExitStack() as undo:  # what a launch that fails lets go of
            closing = undo.enter_context(contextlib.ExitStack())  # the log, until it is copied into
            closing.callback(log.close)
            confinement = None
            spawned = argv
            if runs_as is not None and self._sandbox.cgroups is not None:
                try:
                    confinement = self._sandbox.cgroups.confine(task.task_id, task.gpu_indices)
                except OSError as exc:
                    raise LaunchError(f"cannot make the task's cgroup: {exc}", 126) from exc
                undo.callback(confinement.release)
                spawned = [*spawn_prefix(runs_as.uid, runs_as.gid, confinement), *argv]
            gpus = ",".join(str(index) for index in task.gpu_indices)
            command = shlex.join(argv).replace("\n", "\\n")  # one line, whatever the script
            log.write(f"--- task {task.task_id} on GPUs [{gpus}]: {command}\n".encode())
            home = self._sandbox.home(runs_as)
            env = task_environment(
                self._sandbox.environment(runs_as, home=home, scratch=scratch),
                task,
                model_resident=model_resident,
                secrets=secrets,
            )
            try:
                output = await OutputPipes.into(log, runs_as)
            except OSError as exc:
                raise LaunchError(f"cannot make the task's output pipes: {exc}", 126) from exc
            closing.pop_all()  # the copying of its output closes the log once it ends
            try:
                process = await _spawn(
                    spawned,
                    argv[0],
                    (output.stdout, output.stderr),
                    env,
                    _identity(runs_as, home or str(scratch), switch=confinement is None),
                )
            except LaunchError as exc:
                log.write(f"--- not started: {exc.reason}\n".encode())
                raise
            finally:
                # The task has its copies: EOF once it (and its own) end.
                os.close(output.stdout)
                os.close(output.stderr)
            undo.pop_all()  # started: its cgroup goes once it ends
        if self._ledger is not None:
            self._ledger.record(process.pid)
        return ProcessExecution(
            process,
            copying=output.copying,
            grace_s=self._grace_s,
            ledger=self._ledger,
            confinement=confinement,
            scratch=self._scratch,
            job_id=task.job_id,
        )


async def _spawn(
    argv: list[str],
    command: str,
    output: tuple[int, int],
    env: dict[str, str],
    identity: dict[str, Any],
) -> asyncio.subprocess.Process:
    """Start ``argv`` with its stdout and stderr on the ``output`` descriptors;
    ``LaunchError`` naming ``command`` (the task's own, whatever runs before it) when it
    cannot start."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output[0],
            stderr=output[1],
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


def _identity(runs_as: Account | None, cwd: str, *, switch: bool) -> dict[str, Any]:
    """The subprocess options that start the task in ``cwd`` and make it its account's:
    files it creates private to it and, with ``switch``, its account with no groups of
    the agent's (else ``spawn_prefix`` switches, after joining the task's cgroups)."""
    options: dict[str, Any] = {"cwd": cwd}
    if runs_as is None:
        return options
    options["umask"] = 0o077
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
    scratch: ScratchFolders  # its job's folder is there
    job_id: str
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

    def cleanup(self, may_return: bool) -> None:
        self.scratch.leave(self.job_id, may_return=may_return)

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

    async def close(self) -> None:
        """Nothing runs in the background."""

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

    def cleanup(self, may_return: bool) -> None:
        """Nothing was used."""
