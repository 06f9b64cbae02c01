"""A task's output on its node: written by the agent with a size bound, read back (and
followed) for admission's ``qm logs``.

Each task has a log of its own: ``<log_dir>/<job>/<task>.log``, where ``<task>`` is what
follows the job's id in the task's id (``1`` for attempt 2, ``1.0`` for its part 1 in a
gang, a workflow task's name), so attempts and parts never share a file. The log is the
task's account's, 0600, as issue 41 asks (a task's output is its user's); the agent
creates it and hands the descriptor to the task's keeper (``keeper.py``), which writes
it (``TaskLog.adopt``); the agent reads it back for ``qm logs``
with DAC_READ_SEARCH (``privileges.py``). The folders above it are the agent's (0700):
no task reaches any log, its own included. Beside it, ``<task>.task`` says which
task and node it is and when it started, for ``ListTaskLogs``. Names are escaped
(``safe_name``), so no id leaves its folder, and nothing is opened through a link.

The task writes into pipes, not the file, so that its keeper can bound it: past
``max_bytes`` the file moves to ``<task>.log.1`` (replacing an older one) and a new one
starts, as container runtimes rotate logs, so a task keeps at most twice ``max_bytes``
on the node whatever it prints, and its last words are kept. stdout and stderr have a
pipe each and reach the log in whole lines (``lines.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from qm.v1 import events_pb2

from libs.core.ids import name_in_job
from services.node_agent.accounts import Account
from services.node_agent.lines import LineJoiner
from services.node_agent.names import safe_name

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# A stream's unfinished line goes to the log once the stream has been quiet this long.
QUIET_S = 0.5
_STREAMS = ("stdout", "stderr")


def rotated(path: Path) -> Path:
    """Where the older part of a rotated log is kept."""
    return path.with_name(path.name + ".1")


@dataclass(frozen=True)
class LogEntry:
    """A task whose log the agent keeps."""

    task_id: str
    node_id: str
    started: float  # seconds since the epoch


class TaskLogs:
    """The agent's task logs under ``root``: one per task, in a folder per job."""

    def __init__(self, root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = root
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def prepare(self) -> None:
        """Make the root folder the agent's alone (0700), as it starts."""
        _private_folder(self.root, parents=True)

    def path(self, job_id: str, task_id: str) -> Path:
        """Where the task's log is (or would be)."""
        return self._folder(job_id) / f"{safe_name(name_in_job(job_id, task_id))}.log"

    def open(self, task: events_pb2.TaskPlaced, owner: Account | None) -> TaskLog:
        """A new log for the task, ``owner``'s (None: the agent's); ``OSError`` if it
        cannot be made. A log the same task id left (an agent restarted as it ran) is
        kept as its older part."""
        _private_folder(self.root, parents=True)
        _private_folder(self._folder(task.job_id), parents=False)
        path = self.path(task.job_id, task.task_id)
        sink = TaskLog(path, max_bytes=self._max_bytes, owner=owner)
        entry = {"task_id": task.task_id, "node_id": task.node_id, "started": time.time()}
        try:
            _write_new(path.with_suffix(".task"), json.dumps(entry).encode())
        except OSError:
            sink.close()
            raise
        return sink

    def entries(self, job_id: str) -> list[LogEntry]:
        """The job's tasks with a log here; records that do not read back are skipped."""
        folder = self._folder(job_id)
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".task"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for name in names:
            entry = _read_entry(folder / name)
            # A record that names another task than its file's is not this task's.
            if entry is not None and self.path(job_id, entry.task_id).stem == name[:-5]:
                found.append(entry)
        return found

    def _folder(self, job_id: str) -> Path:
        return self.root / safe_name(job_id)


def _private_folder(path: Path, *, parents: bool) -> None:
    """Make ``path`` a folder only its owner enters, or check that it is one of ours:
    never a link (whoever could plant one there could send the logs elsewhere)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=parents)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise OSError(f"{path} is not a folder of this agent's")
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _write_new(path: Path, data: bytes) -> None:
    """Write a small file of the agent's, replacing one there, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _read_entry(path: Path) -> LogEntry | None:
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as file:
            raw = json.loads(file.read(64 * 1024))
        return LogEntry(str(raw["task_id"]), str(raw["node_id"]), float(raw["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
        try:
            self._file = _create_private(path, owner)
        except FileExistsError:
            os.replace(path, rotated(path))
            self._file = _create_private(path, owner)
        self._size = 0
        self._failed = False

    @classmethod
    def adopt(cls, fd: int, path: Path, max_bytes: int, owner: Account | None) -> TaskLog:
        """The log ``open`` made, by the descriptor it was handed on (a task's keeper
        writes it; ``keeper.py``)."""
        sink = cls.__new__(cls)
        sink._path, sink._max_bytes, sink._owner = path, max_bytes, owner
        sink._file = os.fdopen(fd, "ab")
        sink._size = os.fstat(fd).st_size
        sink._failed = False
        return sink

    def fileno(self) -> int:
        return self._file.fileno()

    def write(self, data: bytes) -> None:
        if not data:
            return
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
        self._file = _create_private(self._path, self._owner)
        self._size = 0


def _create_private(path: Path, owner: Account | None) -> BinaryIO:
    """A new file at ``path`` (``FileExistsError`` if there is one: the agent, which may
    not override permissions, could not open another account's file), readable by its
    own account only (and the agent)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


class OutputPipes:
    """The pipes a task writes its stdout and stderr into, their read ends copied into the
    task's log in whole lines.

    The pipes are the agent's own, not asyncio's subprocess pipes: asyncio waits for its
    pipes to close before it reports the process ended, and whatever the task left
    running may hold them open (the cgroup that kills those is released only once
    the task has ended)."""

    def __init__(self, write_fds: tuple[int, int], copying: asyncio.Task[None]) -> None:
        self.stdout, self.stderr = write_fds  # the child's; close them once it is spawned
        self.copying = copying

    @classmethod
    async def into(cls, sink: TaskLog, owner: Account | None) -> OutputPipes:
        """Pipes into ``sink``; ``owner`` (the task's account) may reopen them, as
        programs do through /dev/stdout and /dev/stderr."""
        loop = asyncio.get_running_loop()
        write_fds, reading = [], []
        with contextlib.ExitStack() as undo:  # what a failure here lets go of
            for stream in _STREAMS:
                read_fd, write_fd = os.pipe()
                undo.callback(os.close, write_fd)
                read_end = undo.enter_context(os.fdopen(read_fd, "rb", 0))
                if owner is not None:
                    os.fchown(write_fd, owner.uid, owner.gid)
                reader = asyncio.StreamReader()
                transport, _ = await loop.connect_read_pipe(
                    lambda reader=reader: asyncio.StreamReaderProtocol(reader),  # type: ignore[misc]
                    read_end,
                )
                undo.callback(transport.close)
                write_fds.append(write_fd)
                reading.append((stream, reader, transport))
            undo.pop_all()  # the write ends are the caller's, the read ends the copying's
        joiner = LineJoiner()
        copies = [_copy(*read, joiner, sink) for read in reading]
        copying = asyncio.create_task(_copy_all(copies, sink))
        return cls((write_fds[0], write_fds[1]), copying)


async def _copy_all(copies: list[Coroutine[Any, Any, None]], sink: TaskLog) -> None:
    """Both streams until each ended; the log is closed then, or when cancelled."""
    try:
        await asyncio.gather(*copies)
    finally:
        sink.close()


async def _copy(
    stream: str,
    output: asyncio.StreamReader,
    pipe: asyncio.BaseTransport,
    joiner: LineJoiner,
    sink: TaskLog,
) -> None:
    """Copy one stream into the log until every writer closed its pipe (the task and
    whatever it started); an unfinished line goes once the stream is quiet for
    ``QUIET_S``, or ends."""
    try:
        while True:
            try:
                async with asyncio.timeout(QUIET_S if joiner.holds(stream) else None):
                    chunk = await output.read(CHUNK_BYTES)
            except TimeoutError:
                sink.write(joiner.flush(stream))
                continue
            if not chunk:
                break
            sink.write(joiner.feed(stream, chunk))
        sink.write(joiner.flush(stream))
    finally:
        pipe.close()


async def read_log(
    path: Path, *, follow: bool, active: Callable[[], bool], poll_s: float = 0.2
) -> AsyncIterator[bytes]:
    """The log from its oldest kept byte (``<name>.1``, then ``<name>``); with ``follow``,
    what is appended next, across rotations (as ``tail -F``), until ``active()`` says
    the task has ended and everything it wrote has been read."""
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
