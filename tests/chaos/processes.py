"""Which processes a chaos run left behind: found by the mark in their environment.

Every process of a run (supervisors, services, the broker, the tasks that process
node agents start) inherits ``QM_CHAOS_RUN=<run id>``; nothing else carries it, so
ending the marked processes ends only what the run started.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.chaos.stack import MARK


def marked(run_id: str) -> dict[int, str]:
    """Processes of this user carrying the mark of ``run_id``: pid -> command line."""
    if not run_id:
        raise ValueError("a run id is needed: other runs on this machine are not ours to end")
    wanted = f"{MARK}={run_id}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if wanted in environ:
            found[int(entry.name)] = command.strip()
    return found


def kill_marked(run_id: str) -> list[str]:
    """SIGKILL every marked process; returns those it found, as "pid command line"."""
    found = marked(run_id)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"{pid} {command[:120]}" for pid, command in found.items()]
