"""Service exits as the supervisors logged them, with the error each service last logged.

An exit whose pid the harness did not kill is a crash.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

# "2026-12-03 04:35:27,800 placement WARNING supervise: pid 8456 was killed by SIGKILL after"
_EXIT = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) (?P<name>\S+) WARNING supervise: "
    r"pid (?P<pid>\d+) (?P<how>exited with code -?\d+|was killed by \S+) after"
)
TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class Exit:
    at: float  # seconds since the epoch
    service: str
    pid: int
    how: str
    cause: str  # the service's last logged error before it exited ("" if none)

    def __str__(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.at))
        return (
            f"{clock} {self.service} pid {self.pid} {self.how}: {self.cause or 'no error logged'}"
        )


def exits(log: Path) -> list[Exit]:
    found = []
    cause = ""
    in_traceback = False
    for line in log.read_text(errors="replace").splitlines():
        match = _EXIT.match(line)
        if match is None:
            # A traceback's frames are indented; its first line that is not names the error.
            if line.startswith(TRACEBACK):
                in_traceback = True
            elif in_traceback and line and not line[0].isspace():
                in_traceback = False
                if not line.startswith("During handling"):
                    cause = line[:300]
            continue
        at = time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1000
        found.append(Exit(at, match["name"], int(match["pid"]), match["how"], cause))
        cause = ""
    return found


def crashes(logs: Path, killed: set[int], since: float, until: float) -> list[Exit]:
    """Exits in [since, until) of processes the harness did not kill."""
    return [
        e
        for path in sorted(logs.glob("*.log"))
        for e in exits(path)
        if e.pid not in killed and since <= e.at < until
    ]
