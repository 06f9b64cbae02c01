"""Task processes an agent left behind when it died, found and killed by the next one.

Tasks run in process groups of their own, so they outlive an agent killed with
SIGKILL. Placement counts them as lost once the node registers again with a new
incarnation (or goes silent), and may give their GPUs to other work: so a restarted
agent kills them before it registers. Each running task has a file in the state
folder naming its process group and the process's start time (from /proc), so that
a pid the kernel has since reused is never killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)


class ProcessLedger:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def record(self, pid: int) -> None:
        """A task started as the leader of process group ``pid``."""
        started = _start_time(pid)
        if started is None:
            return  # already gone
        self._folder.mkdir(parents=True, exist_ok=True)
        self._file(pid).write_text(started)

    def forget(self, pid: int) -> None:
        """The task's process was reaped."""
        with contextlib.suppress(FileNotFoundError):
            self._file(pid).unlink()

    def kill_leftovers(self) -> list[int]:
        """Kill the process groups recorded by an earlier agent; return their ids."""
        killed = []
        for entry in sorted(self._folder.glob("*.pgid")) if self._folder.is_dir() else []:
            try:
                pid, started = int(entry.stem), entry.read_text()
            except (OSError, ValueError):
                entry.unlink(missing_ok=True)
                continue
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
                    log.warning("killed task process group %d left by an earlier agent", pid)
            entry.unlink(missing_ok=True)
        return killed

    def _file(self, pid: int) -> Path:
        return self._folder / f"{pid}.pgid"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, as /proc says; None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]  # field 22 of the whole line
