"""Run one service and start it again whenever it exits, with backoff, as Kubernetes would.

Usage: python deploy/local/supervise.py --name NAME [--child-pidfile FILE] -- COMMAND...

The command's output goes where this process's output goes (the service's log);
each exit and restart is logged there too. A service that exits, whatever its exit
code, is started again after 1 s, then 2, 4, ... up to 30 s between starts (a crash
loop backs off as a CrashLoopBackOff does); a run that lasted 60 s resets the wait
to 1 s. SIGTERM or SIGINT stops the service (SIGTERM, then SIGKILL after --grace
seconds) and then this process. ``--child-pidfile`` holds the running service's pid
(absent between runs), so that `stack.sh status` and tests can find it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

log = logging.getLogger("supervise")
POLL_S = 0.1


@dataclass
class Backoff:
    """How long to wait before the next start, given how long the last run lasted."""

    initial_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0
    _next_s: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial ({self.initial_s}) <= max ({self.max_s})")
        self._next_s = self.initial_s

    def delay(self, uptime_s: float) -> float:
        if uptime_s >= self.reset_after_s:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay


def describe_exit(code: int) -> str:
    """``subprocess`` return codes in words: negative ones are signals."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(
        self,
        command: list[str],
        *,
        backoff: Backoff,
        grace_s: float,
        child_pidfile: Path | None = None,
    ) -> None:
        self._command = command
        self._backoff = backoff
        self._grace_s = grace_s
        self._pidfile = child_pidfile
        self._stop_requested: float | None = None  # monotonic time of the first SIGTERM
        self.restarts = 0

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        """The signal handler: only notes the request; the loop acts on it."""
        if self._stop_requested is None:
            self._stop_requested = time.monotonic()
            log.info("%s: stopping", signal.Signals(signum).name)

    def run(self) -> int:
        """Start, wait, restart, until asked to stop; 0 once stopped."""
        while self._stop_requested is None:
            started = time.monotonic()
            try:
                child = subprocess.Popen(self._command)
            except OSError as exc:
                log.error("cannot start %s: %s", self._command[0], exc)
                return 2
            self._write_pidfile(child.pid)
            log.info("started pid %d: %s", child.pid, " ".join(self._command))
            code = self._wait(child)
            self._write_pidfile(None)
            uptime = time.monotonic() - started
            if self._stop_requested is not None:
                log.info("pid %d %s; stopped", child.pid, describe_exit(code))
                break
            delay = self._backoff.delay(uptime)
            self.restarts += 1
            log.warning(
                "pid %d %s after %.1f s; restart %d in %g s",
                child.pid,
                describe_exit(code),
                uptime,
                self.restarts,
                delay,
            )
            self._sleep(delay)
        return 0

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """Wait for the child; once a stop is asked, SIGTERM it, and SIGKILL after the grace."""
        terminated = False
        while True:
            try:
                return child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            asked = self._stop_requested
            if asked is None:
                continue
            if not terminated:
                child.terminate()
                terminated = True
            elif time.monotonic() - asked > self._grace_s:
                log.warning("pid %d did not stop in %g s: SIGKILL", child.pid, self._grace_s)
                child.kill()
                return child.wait()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._stop_requested is None and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _write_pidfile(self, pid: int | None) -> None:
        if self._pidfile is None:
            return
        if pid is None:
            self._pidfile.unlink(missing_ok=True)
        else:
            self._pidfile.write_text(f"{pid}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="supervise.py",
        description="Run a service; restart it with backoff when it exits.",
    )
    parser.add_argument("--name", required=True, help="the service's name, for the log")
    parser.add_argument("--child-pidfile", type=Path, help="where to keep the service's pid")
    parser.add_argument(
        "--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL"
    )
    parser.add_argument("--initial-backoff", type=float, default=1.0, help="first wait, s")
    parser.add_argument("--max-backoff", type=float, default=30.0, help="longest wait, s")
    parser.add_argument(
        "--reset-after", type=float, default=60.0, help="a run this long resets the wait, s"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    try:
        backoff = Backoff(args.initial_backoff, args.max_backoff, args.reset_after)
    except ValueError as exc:
        parser.error(f"--initial-backoff/--max-backoff: {exc}")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {args.name} %(levelname)s supervise: %(message)s",
        stream=sys.stdout,
    )
    supervisor = Supervisor(
        command, backoff=backoff, grace_s=args.grace, child_pidfile=args.child_pidfile
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, supervisor.request_stop)
    log.info("supervising %s (pid %d)", args.name, os.getpid())
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
