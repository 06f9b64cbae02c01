"""A task's output on its node: written by the agent with a size bound, read back (and
followed) for admission's ``qm logs``.

A job's output goes to ``<log_dir>/<job_id>.log``, every attempt and every task of the
job that ran under this agent appended with a header line. The task writes into a pipe,
not the file, so that the agent can bound it: past ``max_bytes`` the file moves to
``<job_id>.log.1`` (replacing an older one) and a new one starts, as container runtimes
rotate logs, so a job keeps at most twice ``max_bytes`` on the node whatever it prints,
and its last words are kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from services.node_agent.sandbox import Account

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def log_file_name(job_id: str) -> str:
    """``<job_id>.log``, with anything that could leave the log folder replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]|^\.+", "_", job_id) + ".log"


def rotated(path: Path) -> Path:
    """Where the older part of a rotated log is kept."""
    return path.with_name(path.name + ".1")


class TaskLog:
    """Appends a task's output to ``path``, readable by ``owner`` (the task's account;
    None: the agent's) and the agent only, rotating past ``max_bytes``.

    Writing never fails the task: a write the disk refuses is reported once and the
    output dropped, so that the task never blocks on a full pipe.
    """

    def __init__(self, path: Path, *, max_bytes: int, owner: Account | None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        self._path = path
        self._max_bytes = max_bytes
        self._owner = owner
        self._file = _open_private(path, owner)
        self._size = self._file.seek(0, os.SEEK_END)
        self._failed = False

    def write(self, data: bytes) -> None:
        try:
            if self._size and self._size + len(data) > self._max_bytes:
                self._rotate()
            self._file.write(data)
            self._file.flush()
            self._size += len(data)
        except OSError as exc:
            if not self._failed:
                log.warning("task output to %s dropped: %s", self._path, exc.strerror)
            self._failed = True

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self._path, rotated(self._path))
        self._file = _open_private(self._path, self._owner)
        self._size = 0


def _open_private(path: Path, owner: Account | None) -> BinaryIO:
    """The log, appended to; readable by its own account only (and the agent). Never
    through a link: the folder is the agent's, but a link is not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


class OutputPipe:
    """The pipe a task writes its output into, its read end copied into the task's log.

    The pipe is the agent's own, not asyncio's subprocess pipe: asyncio waits for its
    pipes to close before it reports the process ended, and whatever the task left
    running may hold them open (the cgroup that kills those is released only once
    the task has ended)."""

    def __init__(self, write_fd: int, copying: asyncio.Task[None]) -> None:
        self.write_fd = write_fd  # the child's stdout and stderr; close it once spawned
        self.copying = copying

    @classmethod
    async def into(cls, sink: TaskLog, owner: Account | None) -> OutputPipe:
        """A pipe into ``sink``; ``owner`` (the task's account) may reopen it, as
        programs do through /dev/stdout and /dev/stderr."""
        read_fd, write_fd = os.pipe()
        if owner is not None:
            os.fchown(write_fd, owner.uid, owner.gid)
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        return cls(write_fd, asyncio.create_task(_copy(reader, transport, sink)))


async def _copy(output: asyncio.StreamReader, pipe: asyncio.BaseTransport, sink: TaskLog) -> None:
    """Copy a task's output into its log until every writer closed the pipe (the task
    and whatever it started); the log and the pipe are closed then, or when cancelled."""
    try:
        while chunk := await output.read(CHUNK_BYTES):
            sink.write(chunk)
    finally:
        pipe.close()
        sink.close()


async def read_log(
    path: Path, *, follow: bool, active: Callable[[], bool], poll_s: float = 0.2
) -> AsyncIterator[bytes]:
    """The log from its oldest kept byte (``<name>.1``, then ``<name>``); with ``follow``,
    what is appended next, across rotations (as ``tail -F``), until ``active()`` says
    the job's tasks here have ended and everything they wrote has been read."""
    current = _open_reading(path)
    # Opened after the current file: if a rotation came in between, both are the same.
    older = _open_reading(rotated(path))
    if older is not None:
        with older:
            if current is None or not _same_file(older, current):
                for chunk in _chunks(older):
                    yield chunk
    try:
        while True:
            ended = not active()  # asked before the last read: nothing is written after
            if current is not None:
                for chunk in _chunks(current):
                    yield chunk
            if not follow:
                return
            newer = _open_reading(path)
            if newer is not None and (current is None or not _same_file(newer, current)):
                if current is not None:  # rotated: finish the old file, then the new one
                    for chunk in _chunks(current):
                        yield chunk
                    current.close()
                current = newer
                continue
            if newer is not None:
                newer.close()
            if ended:
                return
            await asyncio.sleep(poll_s)
    finally:
        if current is not None:
            current.close()


def _open_reading(path: Path) -> BinaryIO | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    return os.fdopen(fd, "rb")


def _same_file(one: BinaryIO, other: BinaryIO) -> bool:
    a, b = os.fstat(one.fileno()), os.fstat(other.fileno())
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    """What is in ``file`` past its position, to its end."""
    while chunk := file.read(CHUNK_BYTES):
        yield chunk
