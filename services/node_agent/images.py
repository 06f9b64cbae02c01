"""Tasks in OCI images (``qm submit --image``): the node agent's side of podman.

``containers.py`` builds the command lines and texts; this runs them. A task in an image
is launched like a process (its output through the agent's pipes, its stop by signals
to ``podman run``'s process group, which podman passes on to the container's init), with
three differences: podman runs as root and switches to the task's account itself, the
task's environment goes through a file only root reads, and a SIGKILL goes to the
container (``podman kill``): killing ``podman run`` alone would leave it running. Once
the task ended its container is removed, with its environment file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qm.v1 import events_pb2

from libs.config.sandbox import ContainersEntry, VolumeEntry
from services.node_agent.containers import (
    Bind,
    ContainerError,
    ContainerRun,
    Storage,
    container_name,
    container_path,
    containers_conf,
    env_file_text,
    gpu_devices,
    nvidia_cdi_spec,
    podman_argv,
    podman_kill_argv,
    podman_rm_argv,
    resolve_mounts,
    task_labels,
    validate_image_ref,
    write_private,
)

log = logging.getLogger(__name__)

# Where the agent keeps its images and containers unless the sandbox file says: the
# folder `make example-image` builds localhost/qm-example:1 into (from the repository).
DEFAULT_ROOT = Path(".local/podman")
# podman's own failures (125: podman, 126: not runnable, 127: not found) are exit codes
# a task could give too; a signal's end reads 128 + N, as a shell's.
_SIGNALLED = range(129, 129 + 64)


@dataclass(frozen=True)
class ContainerLaunch:
    """What starts one task's container: ``argv`` (as root, in ``env``), and its name."""

    argv: list[str]
    env: dict[str, str]
    name: str


class Images:
    """Runs tasks' images through podman, with the agent's own storage and config."""

    def __init__(
        self,
        config: ContainersEntry,
        volumes: Mapping[str, VolumeEntry],
        *,
        path: str,
        memory_per_gpu_bytes: int | None = None,
    ) -> None:
        self._config = config
        self._volumes = volumes
        self._path = path  # the agent's PATH: podman and its runtime are found there
        self._memory_per_gpu = memory_per_gpu_bytes
        self.storage = Storage.of(config, DEFAULT_ROOT)
        self.required = config.required  # a job without an image is refused here
        self._podman = shutil.which("podman", path=path)

    def prepare(self) -> None:
        """Write podman's config for the agent's storage; OSError if it cannot be."""
        write_private(self.storage.conf, containers_conf(self._config, self.storage))

    def launch(
        self,
        task: events_pb2.TaskPlaced,
        argv: list[str],
        *,
        uid: int,
        gid: int,
        scratch: Path,
        binds: Mapping[str, Path],
        env: Mapping[str, str],
        gpu_uuids: Mapping[int, str] | None = None,
    ) -> ContainerLaunch:
        """The task's ``podman run``, its environment file written; ContainerError saying
        why it cannot run here (no podman, a bad image or mount, an environment podman
        cannot carry). ``binds``: the agent's folders it sees read-write at their paths
        (its checkpoint folder); the scratch folder is its working directory unless it
        names one. ``gpu_uuids``: its GPUs' (NVML's), for their CDI names."""
        if self._podman is None:
            raise ContainerError(f"image: this node has no podman (PATH {self._path})")
        spec = task.spec
        image = validate_image_ref(spec.image)
        taken = [str(scratch), *(str(path) for path in binds.values())]
        mounts = resolve_mounts(
            ((m.volume, m.path) for m in spec.mounts), self._volumes, spec.allocation, taken=taken
        )
        workdir = container_path(spec.workdir, "workdir") if spec.workdir else str(scratch)
        name = container_name(task.task_id)
        env_file = self.storage.env_file(name)
        write_private(env_file, env_file_text(env))
        devices = gpu_devices(
            task.gpu_indices, cdi=nvidia_cdi_spec(), uuids=gpu_uuids or {}, exists=os.path.exists
        )
        memory = self._memory_per_gpu * len(task.gpu_indices) if self._memory_per_gpu else None
        run = ContainerRun(
            name=name,
            image=image,
            command=argv,
            uid=uid,
            gid=gid,
            workdir=workdir,
            scratch=str(scratch),
            binds=[*_own(binds), *mounts],
            devices=devices,
            env_file=str(env_file),
            memory_bytes=memory,
            labels=task_labels(task.job_id, task.task_id, task.node_id),
        )
        argv = podman_argv(
            self._podman,
            self.storage,
            run,
            pull=self._config.pull,
            authfile=self._config.registries_auth_file,
        )
        return ContainerLaunch(argv, self.storage.environment(self._path), name)

    async def kill(self, name: str) -> None:
        """SIGKILL to the container (its ``podman run`` may be gone, or stuck)."""
        assert self._podman is not None  # launched
        await self._run(podman_kill_argv(self._podman, self.storage, name, signal.SIGKILL))

    async def remove(self, name: str) -> None:
        """The container and its environment file, once the task ended."""
        assert self._podman is not None  # launched
        await self._run(podman_rm_argv(self._podman, self.storage, name))
        with contextlib.suppress(FileNotFoundError):
            self.storage.env_file(name).unlink()

    async def _run(self, argv: list[str]) -> None:
        try:
            child = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=self.storage.environment(self._path),
            )
            _, errors = await child.communicate()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s failed: %s", " ".join(argv[-3:]), exc)
            return
        if child.returncode:
            log.warning("%s: %s", " ".join(argv[-3:]), errors.decode(errors="replace").strip())


def exit_code(code: int) -> int:
    """A container's exit code as the agent reports a process's: negative for a signal."""
    return -(code - 128) if code in _SIGNALLED else code


def _own(binds: Mapping[str, Path]) -> list[Bind]:
    return [Bind(str(path), str(path), read_only=False) for path in binds.values()]
