"""A task's keeper: the process between the node agent and a task, so that the agent can
restart, or die, and leave the task running.

The agent starts ``python -m services.node_agent.keeper`` (as itself, in a session of its
own) for each task it runs as a process, a task in an image too (the keeper runs its
``podman run``). It hands the keeper the launch on stdin (``Launch``: the command, its
environment and account, the descriptor of the task's log) and reads back one line: the
task's pid, or why it could not start. The keeper copies the task's output into its log
in whole lines (``tasklogs.OutputPipes``), waits for the task, and writes how it ended
into ``status`` (``Ended``, a file only the agent reads); then it exits. The agent waits
for it (``Kept``: as its child, or, after a restart, as any process) and reads that file.

A task is stopped by signalling its own process group, never the keeper's. The keeper
ignores the signals a terminal or a service manager sends the agent's group: stopping
the agent stops no task (under systemd: ``KillMode=process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from services.node_agent.accounts import Account
from services.node_agent.launch import OUTPUT_DRAIN_S, LaunchError, spawn
from services.node_agent.orphans import start_time
from services.node_agent.tasklogs import OutputPipes, TaskLog

# How long a keeper may take to say the task started (a Python start, then the task's).
STARTED_WITHIN_S = 60.0
# What a task that ended unseen is said to have exited with: its keeper died too (a
# reboot, a SIGKILL to it), so nobody saw the end.
UNSEEN_EXIT = -signal.SIGKILL.value


@dataclass(frozen=True)
class Launch:
    """What the keeper starts: ``argv`` (``command`` names it in errors) in ``env`` with
    the subprocess options of ``identity``; its output into the log at ``log_path``
    (open as the inherited descriptor ``log_fd``; rotated past ``max_bytes``; made
    ``owner``'s, a uid and gid); how it ended into ``status``."""

    argv: list[str]
    command: str
    env: dict[str, str]
    identity: dict[str, Any]
    log_path: str
    log_fd: int
    max_bytes: int
    owner: tuple[int, int] | None
    status: str


@dataclass(frozen=True)
class Kept:
    """A task and its keeper as the agent follows them: ``child`` when this agent started
    the keeper, else only its pid and start time (``orphans.start_time``: a reused pid
    is not the keeper)."""

    keeper_pid: int
    keeper_started: str
    task_pid: int
    status: Path
    child: asyncio.subprocess.Process | None = None

    async def ended(self) -> int:
        """Once the keeper exits: the task's exit code (``UNSEEN_EXIT`` if the keeper
        died without saying)."""
        if self.child is not None:
            await self.child.wait()
        else:
            await _exited(self.keeper_pid, self.keeper_started)
        return read_status(self.status)

    def alive(self) -> bool:
        return start_time(self.keeper_pid) == self.keeper_started


async def start(launch: Launch) -> Kept:
    """Start the task's keeper; ``LaunchError`` when the task could not start."""
    try:
        keeper = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.node_agent.keeper",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=(launch.log_fd,),
            start_new_session=True,  # the agent's group, signalled as a whole, is not its
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LaunchError(f"cannot start the task's keeper: {exc}", 126) from None
    assert keeper.stdin is not None and keeper.stdout is not None
    keeper.stdin.write(json.dumps(asdict(launch)).encode() + b"\n")
    await keeper.stdin.drain()
    keeper.stdin.close()
    try:
        said = await asyncio.wait_for(keeper.stdout.readline(), STARTED_WITHIN_S)
        reply = json.loads(said)
        if "pid" in reply:
            started = start_time(keeper.pid) or ""
            return Kept(keeper.pid, started, int(reply["pid"]), Path(launch.status), keeper)
        raise LaunchError(str(reply["error"]), int(reply["exit_code"]))
    except (TimeoutError, ValueError, KeyError, TypeError) as exc:
        with contextlib.suppress(ProcessLookupError):
            keeper.kill()
        await keeper.wait()
        raise LaunchError(f"the task's keeper did not start it: {exc!r}", 126) from None


def read_status(path: Path) -> int:
    """The exit code a keeper wrote; ``UNSEEN_EXIT`` when it wrote none."""
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return UNSEEN_EXIT


async def _exited(pid: int, started: str) -> None:
    """Until the process ``pid`` that started at ``started`` exits (it is not a child:
    the agent that started it is gone)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if start_time(pid) != started:
            return  # the pid names another process now: the keeper is gone
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(pidfd, exited)
        try:
            await done
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)


async def keep(launch: Launch, reply: BinaryIO) -> None:
    """Start the task, say how that went on ``reply``, copy its output until it ends,
    and write how it ended."""

    owner = None if launch.owner is None else Account("", launch.owner[0], launch.owner[1], "")
    log = TaskLog.adopt(launch.log_fd, Path(launch.log_path), launch.max_bytes, owner)
    try:
        output = await OutputPipes.into(log, owner)
    except OSError as exc:
        log.close()
        _say(reply, {"error": f"cannot make the task's output pipes: {exc}", "exit_code": 126})
        return
    try:
        process = await spawn(
            launch.argv, launch.command, (output.stdout, output.stderr), launch.env, launch.identity
        )
    except LaunchError as exc:
        _say(reply, {"error": exc.reason, "exit_code": exc.exit_code})
        output.copying.cancel()
        return
    finally:
        # The task has its copies: EOF once it (and its own) end.
        os.close(output.stdout)
        os.close(output.stderr)
    try:
        _say(reply, {"pid": process.pid})
    except BrokenPipeError:
        # The agent died before it heard the task started, and so before it recorded
        # it: no agent will follow it, and the next one starts the placement again.
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        output.copying.cancel()
        return
    code = await process.wait()
    # What it wrote before it ended is in the pipe still. A process it left behind may
    # hold the pipe open: its output after the task ended is not kept.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(output.copying), OUTPUT_DRAIN_S)
    output.copying.cancel()
    _write_status(Path(launch.status), code)


def _say(reply: BinaryIO, message: dict[str, object]) -> None:
    reply.write(json.dumps(message).encode() + b"\n")
    reply.flush()
    reply.close()


def _write_status(path: Path, code: int) -> None:
    """Whole or not at all: the agent reads it once the keeper has exited."""
    temporary = path.with_name(path.name + ".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps({"exit_code": code}))
    os.replace(temporary, path)


def main() -> None:
    # A handler, not SIG_IGN: an ignored signal stays ignored in the task it starts.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: None)
    launch = Launch(**json.loads(sys.stdin.readline()))
    asyncio.run(keep(launch, sys.stdout.buffer))


if __name__ == "__main__":
    main()
