"""A root node agent keeps only the capabilities its work takes.

Root is needed to run each task as its user's account and to manage the task's
processes, logs and cgroups, not for anything else: once started, the agent drops every
other capability from its effective, permitted and bounding sets (so nothing it runs
later, as root or not, regains them). Kept: SETUID and SETGID (switch accounts: to run a
task, and to empty its job's scratch folder as its account, which the agent may not do
as itself), KILL (signal tasks of other accounts), CHOWN and FOWNER (hand a task its
log and its job's scratch folder), DAC_READ_SEARCH (read the secret store and config
whoever wrote them, and the tasks' logs) and, with task cgroups, SYS_ADMIN (the v1
devices controller wants it). NVML needs none: it opens ``/dev/nvidia*``, which the
driver leaves open to all. An agent whose node runs images (``containers:`` in its
sandbox file) keeps them all: rootful podman makes namespaces, mounts and devices.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

CHOWN, DAC_READ_SEARCH, FOWNER, KILL, SETGID, SETUID, SYS_ADMIN = 0, 2, 3, 5, 6, 7, 21
_SETPCAP = 8
_PR_CAPBSET_DROP = 24
_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def needed(*, cgroups: bool) -> frozenset[int]:
    kept = {CHOWN, DAC_READ_SEARCH, FOWNER, KILL, SETGID, SETUID}
    return frozenset(kept | {SYS_ADMIN} if cgroups else kept)


def keep_only(kept: frozenset[int]) -> None:
    """Drop every capability but ``kept`` (numbers below 32) from this process's
    effective and permitted sets and, where it may (it holds SETPCAP; a container's
    runtime has bounded it already otherwise), its bounding set; ``OSError`` if the
    kernel refuses."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if capabilities("CapEff") >> _SETPCAP & 1:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap not in kept and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"cannot drop capability {cap}: {os.strerror(error)}")
    # Only what it holds now can be kept.
    mask = sum(1 << cap for cap in kept) & capabilities("CapPrm")
    data = (_Data * 2)(_Data(mask, mask, 0), _Data(0, 0, 0))
    if libc.capset(ctypes.byref(_Header(_VERSION_3, 0)), data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"cannot set capabilities: {os.strerror(error)}")


def capabilities(kind: str = "CapEff") -> int:
    """This process's capabilities of a kind (``CapEff``, ``CapPrm``, ``CapBnd``), as a
    bit mask."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return int(line.split()[1], 16)
    raise OSError(f"no {kind} in /proc/self/status")
