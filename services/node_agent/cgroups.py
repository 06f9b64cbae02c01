"""Each task in a cgroup of its own, where the host lets the agent make them: memory
limited to what its GPUs come with, and (cgroup v1's devices controller) only its own
GPU devices. Configured in the sandbox file (``libs.config.sandbox``, ``cgroups``).

A parent is a cgroup v2 folder delegated to the agent (``cgroup.controllers`` in it) or a
folder of one cgroup v1 controller (``memory``, ``devices``). The task joins its cgroups
before its command starts (``spawn_prefix``), so nothing it starts escapes them; when it
ends, whatever it left behind in them is killed and the cgroups are removed. cgroup v2
has no devices file (GPU device control there takes eBPF): only memory is limited.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.document import ConfigError
from libs.config.sandbox import CgroupsEntry

log = logging.getLogger(__name__)
GIB = 1 << 30
# /dev/nvidiaN has minor N, which is the NVML index of GPU N on the hosts we know;
# /dev/nvidiactl is minor 255.
NVIDIACTL_MINOR = 255

# Joins each cgroup given, then becomes the task's account and runs its command:
#   sh -c SCRIPT sh UID GID CGROUP.PROCS... -- ARGV...
# setpriv (util-linux) drops to the account with no supplementary groups, and with
# no_new_privs, so that no setuid program the task runs gains anything.
_JOIN_THEN_RUN = (
    'uid=$1 gid=$2; shift 2; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; '
    'done; shift; exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs '
    '-- "$@"'
)


def device_rules(gpu_major: int, minors: Sequence[int]) -> list[str]:
    """The v1 devices controller's lines: a cgroup allows every device but those denied,
    so each GPU device the task was not given is denied by minor (the control device,
    255, and the unified-memory device, which CUDA needs, stay open)."""
    given = set(minors)
    return [f"c {gpu_major}:{m} rwm" for m in range(NVIDIACTL_MINOR) if m not in given]


def char_major(name: str, devices: Path = Path("/proc/devices")) -> int | None:
    """The major number of character device driver ``name``; None when not loaded."""
    with contextlib.suppress(OSError):
        for line in devices.read_text().split("Block devices:")[0].splitlines():
            number, _, driver = line.strip().partition(" ")
            if driver == name and number.isdigit():
                return int(number)
    return None


@dataclass(frozen=True)
class Confinement:
    """One task's cgroups (a folder per parent)."""

    folders: tuple[Path, ...]

    @property
    def procs(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def release(self) -> None:
        """Kill what the task left running in its cgroups, then remove them."""
        for folder in self.folders:
            for _ in range(50):
                with contextlib.suppress(OSError):
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still busy for an instant after the kill
                    os.sched_yield()
            else:
                log.warning("could not remove the task's cgroup %s", folder)


class TaskCgroups:
    """Makes each task's cgroups under the configured parents."""

    def __init__(
        self,
        config: CgroupsEntry,
        *,
        gpu_major: int | None = None,
    ) -> None:
        self._parents = [Path(p) for p in config.parents]
        for parent in self._parents:
            if not (parent / "cgroup.procs").is_file() or not os.access(parent, os.W_OK):
                raise ConfigError(
                    f"sandbox: cgroups: {parent} is not a cgroup folder this agent may "
                    "make cgroups in (delegate one to it, or leave cgroups out)"
                )
        if shutil.which("setpriv") is None:
            raise ConfigError("sandbox: cgroups: setpriv (util-linux) is needed and missing")
        self._memory_per_gpu = (
            int(config.memory_per_gpu_gib * GIB) if config.memory_per_gpu_gib else None
        )
        # A limit the host silently ignores would be no limit: one parent must apply it.
        if self._memory_per_gpu is not None and not any(map(_controls_memory, self._parents)):
            raise ConfigError(
                "sandbox: cgroups: no parent gives its cgroups a memory controller: on "
                "cgroup v1 name the memory hierarchy's folder; on v2 delegate one with +memory"
            )
        # The driver registers its major as "nvidia-frontend" (or "nvidia"); none: no GPUs.
        self._gpu_major = (
            gpu_major
            if gpu_major is not None
            else (char_major("nvidia-frontend") or char_major("nvidia"))
        )

    def confine(self, task_id: str, gpu_minors: Sequence[int]) -> Confinement:
        """A cgroup per parent for this task, its limits written; ``OSError`` if the host
        refuses (the task then does not start)."""
        name = "qm-" + re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)[:80] + "-" + uuid.uuid4().hex[:8]
        made: list[Path] = []
        try:
            for parent in self._parents:
                folder = parent / name
                folder.mkdir(mode=0o755)
                made.append(folder)
                self._limit(folder, len(gpu_minors), gpu_minors)
        except OSError:
            Confinement(tuple(made)).release()
            raise
        return Confinement(tuple(made))

    def _limit(self, folder: Path, gpus: int, minors: Sequence[int]) -> None:
        memory = self._memory_per_gpu * max(gpus, 1) if self._memory_per_gpu else None
        if (folder / "memory.max").exists() and memory:  # cgroup v2
            (folder / "memory.max").write_text(str(memory))
        if (folder / "memory.limit_in_bytes").exists() and memory:  # v1
            (folder / "memory.limit_in_bytes").write_text(str(memory))
        if (folder / "devices.deny").exists() and self._gpu_major is not None:  # v1
            for rule in device_rules(self._gpu_major, minors):
                (folder / "devices.deny").write_text(rule)


def _controls_memory(parent: Path) -> bool:
    """Whether a cgroup made in ``parent`` can be limited in memory (a cgroup v2 parent is
    asked to pass the memory controller down first); a ``ConfigError`` if none can be made."""
    if (parent / "cgroup.subtree_control").exists():
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text("+memory")
    probe = parent / f"qm-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        limited = (probe / "memory.max").exists() or (probe / "memory.limit_in_bytes").exists()
        probe.rmdir()
    except OSError as exc:
        raise ConfigError(f"sandbox: cgroups: cannot make a cgroup in {parent}: {exc}") from None
    return limited


def spawn_prefix(uid: int, gid: int, confinement: Confinement) -> list[str]:
    """The argv before a task's own that joins its cgroups and becomes its account."""
    return ["/bin/sh", "-c", _JOIN_THEN_RUN, "sh", str(uid), str(gid), *confinement.procs, "--"]
