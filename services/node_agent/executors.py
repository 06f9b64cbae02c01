"""How a placed task runs: as a real process on its GPUs, or simulated by a timer.

Both report an exit code the way ``subprocess`` does: negative when a signal ended
the task, so a stopped task reads -15 (SIGTERM) or -9 (SIGKILL) under either executor.

A workflow task (``TaskPlaced.serving``) needs its model on its GPU. The agent keeps
the books of each GPU's model cache and calls ``load_model`` before ``start`` when the
model is not resident: the simulated executor waits the load time; a process loads its
model itself as it starts (told by ``QM_MODEL``, ``QM_MODEL_MB`` and
``QM_MODEL_RESIDENT``), so its ``load_model`` returns at once.

A batch task learns where its job runs (``gangs.py``): its nodes, its rank among them
and, for a job spanning nodes, where to rendezvous and a hostfile in its job's folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qm.v1 import events_pb2

from libs.config.document import ConfigError
from libs.core import simulated
from libs.core.decisions import stop_grace
from libs.core.ids import array_of, attempt_of, name_in_job
from libs.events import wire_time
from services.node_agent import keeper
from services.node_agent.accounts import Account
from services.node_agent.cgroups import Confinement, spawn_prefix
from services.node_agent.checkpoints import POLL_S, StopWarning, saved_at, saved_file
from services.node_agent.containers import ContainerError
from services.node_agent.gangs import Gang, GangError, check_master_port, gang_of
from services.node_agent.images import Images, exit_code
from services.node_agent.keeper import Kept, Launch
from services.node_agent.launch import LaunchError
from services.node_agent.names import safe_name
from services.node_agent.orphans import TaskRecord, TaskRecords, record_of
from services.node_agent.sandbox import Refused, Sandbox
from services.node_agent.scratch import ScratchFolders, may_return
from services.node_agent.secrets import MissingSecret, SecretStore
from services.node_agent.tasklogs import TaskLogs


class Execution(Protocol):
    """One started task."""

    @property
    def pid(self) -> int: ...

    @property
    def saved(self) -> Path | None:
        """The file the task touches when it saved a checkpoint (None: it runs nothing)."""
        ...

    async def wait(self) -> int:
        """Wait for the task to end; return its exit code."""
        ...

    async def stop(self, grace_s: float = 0.0, warning: StopWarning | None = None) -> None:
        """Ask the task to end, and make sure it does, after at most ``grace_s`` (0: the
        executor's grace; ``stop_grace``), after its ``warning`` if any; ``wait`` then
        returns its exit code."""
        ...

    def cleanup(self, may_return: bool) -> None:
        """The task has ended and its end is reported: let go of what it used here (its
        job's scratch folder goes with the job's last task here, unless the job
        ``may_return``: ``scratch.may_return``), in the background (``Executor.close``)."""
        ...


class Executor(Protocol):
    async def start(
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False, address: str = ""
    ) -> Execution:
        """Start the task, or raise LaunchError saying why it could not start.

        ``model_resident``: a serving task's model is already on its GPU. ``address``:
        where other nodes reach the task's node (``NodeInventory.address``).
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
    gang: Gang | None = None,
    files: Mapping[str, Path] | None = None,
) -> dict[str, str]:
    """The sandbox's ``base`` (a few of the agent's variables), then the job's extras and
    its ``secrets`` (from the node's store), then what the agent decides.

    The agent's own variables come last so that a job cannot widen its GPU set. CUDA
    numbers GPUs fastest first unless told otherwise; NVML, whose indices the inventory
    and the utilisation sampler use, numbers them by PCI bus. A serving task also gets
    ``QM_TASK`` (its name in the workflow), ``QM_MODEL``, ``QM_MODEL_MB`` and
    ``QM_MODEL_RESIDENT`` ("1" when the agent's books say the model is cached, else "0").
    A batch task gets ``QM_RESTART_COUNT`` (its attempt: 0 on its first run), an array's
    element ``QM_ARRAY_ID``, ``QM_ARRAY_INDEX`` and ``QM_ARRAY_COUNT``, and, from
    its ``gang`` (``gangs.gang_of``), ``QM_NUM_NODES``, ``QM_NODE_RANK``,
    ``QM_GPUS_PER_NODE`` and ``QM_HOSTS`` (its nodes' addresses, comma-separated, in rank
    order); a job spanning nodes also ``MASTER_ADDR`` and ``MASTER_PORT`` (where rank 0
    listens for the rendezvous) and ``QM_HOSTFILE`` (``ADDRESS slots=GPUS`` a line, in
    rank order). The launcher's own (``WORLD_SIZE``, ``RANK``) are torchrun's. ``files``
    names what the agent made for the task (``QM_HOSTFILE``, ``QM_CHECKPOINT_DIR``,
    ``QM_CHECKPOINT_SAVED``: ``checkpoints``).
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
    else:
        env["QM_RESTART_COUNT"] = str(attempt_of(task.task_id))
    if task.spec.HasField("array"):
        env |= {
            "QM_ARRAY_ID": array_of(task.job_id) or "",
            "QM_ARRAY_INDEX": str(task.spec.array.index),
            "QM_ARRAY_COUNT": str(task.spec.array.count),
        }
    if gang is not None:
        env |= gang.environment()
    env |= {name: str(path) for name, path in (files or {}).items()}
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
        records: TaskRecords | None = None,
    ) -> None:
        self.logs = logs
        self._grace_s = grace_s
        self._sandbox = sandbox
        self._scratch = ScratchFolders(
            Path(sandbox.scratch.root), expire_after_s=sandbox.scratch.expire_after_s
        )
        declared = sandbox.checkpoints
        self._checkpoints = (
            None
            if declared is None
            else ScratchFolders(Path(declared.root), expire_after_s=declared.expire_after_s)
        )
        self._secrets = secrets or SecretStore(None)
        # Beside the logs unless told: the state folder (QM_NODE_STATE_DIR) in the agent.
        self._records = records or TaskRecords(logs.root.parent / "node-state")
        self._images = (
            None
            if sandbox.containers is None
            else Images(sandbox.containers, sandbox.volumes, path=os.environ.get("PATH", ""))
        )

    def prepare(self) -> None:
        """Make the folders of task logs and scratch folders, as the agent starts;
        ``ConfigError`` if one cannot be made, or an account that runs tasks cannot
        reach the scratch folders."""
        try:
            self.logs.prepare()
            for folders in self._folders:
                folders.prepare()
        except OSError as exc:
            raise ConfigError(f"node agent: {exc}") from exc
        if self._images is not None:
            try:
                self._images.prepare()
            except OSError as exc:
                raise ConfigError(f"node agent: containers: {exc}") from exc
        for entry, folders in zip(("scratch", "checkpoints"), self._folders, strict=False):
            closed = self._sandbox.closed_to(str(folders.root))
            if closed is not None:
                raise ConfigError(
                    f"sandbox: {entry}.root: account {closed.name} (uid {closed.uid}) cannot "
                    f"reach {folders.root}: a folder above it is closed to it; name a folder "
                    "every account that runs tasks can reach, such as /var/tmp/qm-scratch"
                )

    @property
    def _folders(self) -> tuple[ScratchFolders, ...]:
        """The jobs' folders it keeps: scratch, and checkpoints where declared."""
        return (self._scratch,) if self._checkpoints is None else (self._scratch, self._checkpoints)

    async def load_model(self, task: events_pb2.TaskPlaced, load_ms: float) -> None:
        """Nothing to do here: the task loads its model itself when it starts."""

    async def close(self) -> None:
        for folders in self._folders:
            await folders.close()

    async def start(
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False, address: str = ""
    ) -> ProcessExecution:
        argv = list(task.spec.command)
        if not argv and not task.spec.image:  # an image may have a command of its own
            raise LaunchError("the job has no command to run", 127)
        if task.spec.image and self._images is None:
            raise LaunchError("image: this node runs no images (no containers: here)", 126)
        if not task.spec.image and self._images is not None and self._images.required:
            raise LaunchError("this node runs jobs in images only: qm submit --image REF", 126)
        try:
            runs_as = self._sandbox.account_for(task.spec.user)
            secrets = self._secrets.values(task.spec.user, task.spec.secrets)
            gang = None if task.HasField("serving") else gang_of(task, address)
            if gang is not None:
                await check_master_port(gang, address)
        except (Refused, MissingSecret, GangError) as exc:
            raise LaunchError(str(exc), 126) from None
        entered: list[ScratchFolders] = []
        try:
            folders = []
            for kind, kept in zip(("scratch", "checkpoint"), self._folders, strict=False):
                try:
                    folders.append(await kept.enter(task.job_id, runs_as))
                except OSError as exc:
                    raise LaunchError(f"cannot make the job's {kind} folder: {exc}", 126) from exc
                entered.append(kept)
            scratch = folders[0]
            files = {"QM_CHECKPOINT_SAVED": saved_file(folders[-1], task.task_id)}
            if self._checkpoints is not None:
                files["QM_CHECKPOINT_DIR"] = folders[-1]
            hostfile = await self._hostfile(task, gang)
            if hostfile is not None:
                files["QM_HOSTFILE"] = hostfile
            return await self._launch(
                task, argv, runs_as, scratch, secrets, model_resident, gang, files, entered
            )
        except BaseException as exc:
            # A task that cannot start ended on its own; one cut short otherwise (the
            # agent stops) was stopped for a cause the agent does not know.
            stopped = not isinstance(exc, LaunchError)
            for kept in entered:
                kept.leave(task.job_id, may_return=may_return(task, stopped))
            raise

    async def _hostfile(self, task: events_pb2.TaskPlaced, gang: Gang | None) -> Path | None:
        """A job spanning nodes: its hostfile, written in its job's folder for the task."""
        if gang is None or not gang.spans_nodes:
            return None
        # A file per part: the parts on one agent's nodes share their job's folder.
        name = f"hostfile-{safe_name(name_in_job(task.job_id, task.task_id))}"
        try:
            return await self._scratch.write(task.job_id, name, gang.hostfile())
        except OSError as exc:
            raise LaunchError(f"cannot write the job's hostfile: {exc}", 126) from exc

    async def _launch(
        self,
        task: events_pb2.TaskPlaced,
        argv: list[str],
        runs_as: Account | None,
        scratch: Path,
        secrets: dict[str, str],
        model_resident: bool,
        gang: Gang | None,
        files: dict[str, Path],
        folders: list[ScratchFolders],
    ) -> ProcessExecution:
        try:
            log = self.logs.open(task, runs_as)
        except OSError as exc:
            path = self.logs.path(task.job_id, task.task_id)
            raise LaunchError(f"cannot open the task log {path}: {exc}", 126) from exc
        with contextlib.ExitStack() as undo:  # what a launch that fails lets go of
            # The log is the keeper's once it started: this copy goes either way.
            undo.callback(log.close)
            confinement = None
            container = None
            image = task.spec.image
            home = None if image else self._sandbox.home(runs_as)  # an image has its own
            env = task_environment(
                self._sandbox.environment(runs_as, home=home, scratch=scratch),
                task,
                model_resident=model_resident,
                secrets=secrets,
                gang=gang,
                files=files,
            )
            if image:
                assert self._images is not None  # start() refused the task otherwise
                del env["PATH"]  # the image's own
                try:
                    podman = self._images.launch(
                        task,
                        argv,
                        uid=os.getuid() if runs_as is None else runs_as.uid,
                        gid=os.getgid() if runs_as is None else runs_as.gid,
                        scratch=scratch,
                        binds={k: v for k, v in files.items() if k == "QM_CHECKPOINT_DIR"},
                        env=env,
                    )
                except (ContainerError, OSError) as exc:
                    raise LaunchError(str(exc), 126) from exc
                container = Container(self._images, podman.name)
                undo.callback(self._images.storage.env_file(podman.name).unlink, missing_ok=True)
                spawned, env, identity = podman.argv, podman.env, {"cwd": "/"}
            else:
                spawned = argv
                if runs_as is not None and self._sandbox.cgroups is not None:
                    try:
                        confinement = self._sandbox.cgroups.confine(task.task_id, task.gpu_indices)
                    except OSError as exc:
                        raise LaunchError(f"cannot make the task's cgroup: {exc}", 126) from exc
                    undo.callback(confinement.release)
                    spawned = [*spawn_prefix(runs_as.uid, runs_as.gid, confinement), *argv]
                cwd = task.spec.workdir or home or str(scratch)
                identity = _identity(runs_as, cwd, switch=confinement is None)
            gpus = ",".join(str(index) for index in task.gpu_indices)
            command = shlex.join(argv).replace("\n", "\\n")  # one line, whatever the script
            where = f" in {image}" if image else ""
            log.write(f"--- task {task.task_id} on GPUs [{gpus}]{where}: {command}\n".encode())
            status = self._records.status_file(task.task_id)
            status.unlink(missing_ok=True)  # an earlier run's of the same task id
            launch = Launch(
                argv=spawned,
                command=argv[0] if argv else image,
                env=env,
                identity=identity,
                log_path=str(self.logs.path(task.job_id, task.task_id)),
                log_fd=log.fileno(),
                max_bytes=self.logs.max_bytes,
                owner=None if runs_as is None else (runs_as.uid, runs_as.gid),
                status=str(status),
            )
            try:
                kept = await keeper.start(launch)  # the keeper copies its output from now on
            except LaunchError as exc:
                log.write(f"--- not started: {exc.reason}\n".encode())
                raise
            undo.pop_all()  # started: its cgroup goes once it ends
        record = record_of(
            task,
            keeper_pid=kept.keeper_pid,
            keeper_started=kept.keeper_started,
            task_pid=kept.task_pid,
            status=status,
            container="" if container is None else container.name,
            cgroups=() if confinement is None else confinement.folders,
        )
        self._records.write(task.task_id, record)
        return self._execution(task, kept, confinement, container, files["QM_CHECKPOINT_SAVED"])

    def _execution(
        self,
        task: events_pb2.TaskPlaced,
        kept: Kept,
        confinement: Confinement | None,
        container: Container | None,
        saved: Path,
    ) -> ProcessExecution:
        return ProcessExecution(
            kept,
            grace_s=self._grace_s,
            records=self._records,
            task_id=task.task_id,
            confinement=confinement,
            container=container,
            folders=tuple(self._folders),
            job_id=task.job_id,
            saved=saved,
        )

    async def adopt(self, record: TaskRecord) -> ProcessExecution:
        """Follow a task an earlier agent started (``orphans.adopt``): its keeper runs
        it still, or has written how it ended."""
        task = record.task
        folders = [await kept.enter(task.job_id, None) for kept in self._folders]
        kept = Kept(record.keeper_pid, record.keeper_started, record.task_pid, Path(record.status))
        cgroups = Confinement(tuple(Path(p) for p in record.cgroups)) if record.cgroups else None
        images = self._images
        container = Container(images, record.container) if record.container and images else None
        return self._execution(
            task, kept, cgroups, container, saved_file(folders[-1], task.task_id)
        )


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
class Container:
    """A task's container, by name, and what runs it."""

    images: Images
    name: str


@dataclass
class ProcessExecution:
    """A task run by its keeper (``keeper.py``), the leader of its own process group; on
    record (``records``) until its end is reported, so that a restarted agent takes it
    back."""

    kept: Kept
    grace_s: float
    records: TaskRecords
    task_id: str
    folders: tuple[ScratchFolders, ...]  # its job's folders are there (scratch, checkpoints)
    job_id: str
    saved: Path  # the file it touches when it saved a checkpoint (QM_CHECKPOINT_SAVED)
    confinement: Confinement | None = None
    container: Container | None = None  # a task in an image: its container
    _ending: asyncio.Task[int] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int:
        return self.kept.task_pid

    def _ended(self) -> asyncio.Future[int]:
        """The task's exit code once its keeper has said it (one wait, shared)."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self.kept.ended())
        return asyncio.shield(self._ending)

    async def wait(self) -> int:
        code = await self._ended()
        if self.container is not None:
            code = exit_code(code)
            await self.container.images.remove(self.container.name)
        if self.confinement is not None:  # what it left behind goes with its cgroups
            self.confinement.release()
        return code

    async def stop(self, grace_s: float = 0.0, warning: StopWarning | None = None) -> None:
        """SIGTERM to the task's process group; SIGKILL if it outlives the grace period
        (``grace_s`` may shorten it, never lengthen it). A ``warning``'s signal goes
        first, its time before SIGTERM (cut short once the task saves a checkpoint)."""
        if self._ending is not None and self._ending.done():
            return
        if warning is not None:
            # A save is a change of the file's time: the kernel's file clock is coarse,
            # and may read earlier than this clock did just before the signal.
            before = saved_at(self.saved)
            self._signal(warning.signal)
            deadline = time.monotonic() + warning.seconds
            while (left := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ended(), min(left, POLL_S))
                    return  # it ended on the warning
                if saved_at(self.saved) != before:
                    break  # saved: nothing left to wait for
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._ended(), stop_grace(grace_s, self.grace_s))
        except TimeoutError:
            if self.container is not None:  # podman run passes no SIGKILL on
                await self.container.images.kill(self.container.name)
            self._signal(signal.SIGKILL)
            await self._ended()

    def cleanup(self, may_return: bool) -> None:
        self.records.forget(self.task_id)  # reported: no agent is to take it back
        for folders in self.folders:
            folders.leave(self.job_id, may_return=may_return)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
            os.killpg(self.kept.task_pid, sig)


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
        self, task: events_pb2.TaskPlaced, *, model_resident: bool = False, address: str = ""
    ) -> SimulatedExecution:
        run, _ = simulated.split_env(task.spec.env)
        serving = task.HasField("serving")
        duration_s = wire_time.seconds(task.serving.run_duration) if serving else run.duration_s
        return SimulatedExecution(duration_s, exit_code=run.exit_code)


class SimulatedExecution:
    pid = 0  # no process
    saved = None  # nor checkpoints

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

    async def stop(self, grace_s: float = 0.0, warning: StopWarning | None = None) -> None:
        self._stopped.set()

    def cleanup(self, may_return: bool) -> None:
        """Nothing was used."""
