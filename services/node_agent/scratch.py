"""Each job's scratch folder on its node: where its tasks may write.

``<root>/<job>`` (the job's id escaped as a file name) belongs to the task's account,
mode 0700; ``root`` is the agent's, mode 0711, so accounts pass through it to their own
folder but list nothing. A task gets it as ``TMPDIR``, and as its working directory and
``HOME`` when its account has no home it can use (``sandbox.py``).

The folder is kept while a task of the job runs here, and after its last task here ended
if the job may come back (``may_return``): a workflow's next task may come at any time,
and a requeued job that lands here again finds its files. Otherwise it is removed then.
A job that never comes back although it might (a workflow that ended, a job that ran
elsewhere after a requeue, or one the agent stopped under) leaves a folder that nothing
uses: the sweep removes those unused for ``expire_after_s``, when a task's end here
finds the last sweep over an hour old. Removal and the sweep run in the background, so
that neither holds up the report of a task's end or the start of the next one; a new
task of a job whose folder is being removed waits for that, then has a new one.

The agent may not override file permissions (``privileges.py``), so it cannot delete
what a task wrote: a child process running as the folder's account does (it makes its
own files writable first, as a read-only tree such as Go's module cache needs), and the
agent removes the emptied folder, which lies in its own. Neither can it write in the
folder: a file it hands a task there (a gang's hostfile) is written by such a child too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from qm.v1 import events_pb2, types_pb2

from libs.core.decisions import requeues
from libs.events.convert import stop_cause_from_proto
from services.node_agent.accounts import Account
from services.node_agent.names import safe_name
from services.runtime import cancel_and_wait

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 3600.0
# Where the child that empties a folder finds its tools, whatever the task's PATH.
_TOOLS_PATH = "/usr/bin:/bin"


def may_return(
    task: events_pb2.TaskPlaced,
    stopped: bool,
    cause: types_pb2.StopCause.ValueType = types_pb2.STOP_CAUSE_UNSPECIFIED,
) -> bool:
    """Whether the job of a task that just ended here (``stopped`` for ``cause``) may run
    here again: a workflow's always (its tasks come one after another); a batch job's
    that ended on its own (finished or failed) never, one stopped as placement requeues
    it (``requeues``). A stop whose cause the agent does not know (it is shutting down)
    may be followed by a requeue: kept, for the sweep to decide."""
    if task.HasField("serving"):
        return True
    if not stopped:
        return False
    known = stop_cause_from_proto(cause)
    return known is None or requeues(known, task.spec.resumable)


class ScratchFolders:
    """The jobs' scratch folders under ``root``, and which of them tasks here use."""

    def __init__(self, root: Path, *, expire_after_s: float) -> None:
        self.root = root
        self._expire_after_s = expire_after_s
        self._using: Counter[str] = Counter()  # folder name -> tasks running with it
        self._removing: dict[str, asyncio.Task[None]] = {}
        self._sweeping: asyncio.Task[None] | None = None
        self._next_sweep = 0.0

    def prepare(self) -> None:
        """Make the root folder (the agent's, 0711) if it is not there."""
        self.root.mkdir(parents=True, exist_ok=True)
        found = os.lstat(self.root)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
            raise OSError(f"scratch root {self.root} is not a folder of this agent's")
        os.chmod(self.root, 0o711)

    async def enter(self, job_id: str, owner: Account | None) -> Path:
        """The job's folder, made ``owner``'s (None: the agent's) if it is not yet, for a
        task about to start; ``OSError`` if it cannot be."""
        name = safe_name(job_id)
        removing = self._removing.get(name)
        if removing is not None:  # an old folder of the job's being swept: a new one then
            await asyncio.shield(removing)
        self.prepare()
        path = self.root / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode):
            raise OSError(f"{path} is not a folder")
        if owner is not None and (found.st_uid, found.st_gid) != (owner.uid, owner.gid):
            os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
        os.chmod(path, 0o700)  # a folder (not a link): checked above
        os.utime(path, follow_symlinks=False)  # in use: the sweep measures from here
        self._using[name] += 1
        return path

    def leave(self, job_id: str, *, may_return: bool) -> None:
        """A task of the job ended here: the folder goes with the job's last task here
        (in the background), unless the job ``may_return``."""
        name = safe_name(job_id)
        self._using[name] -= 1
        if self._using[name] > 0:
            return
        del self._using[name]
        if may_return:
            with contextlib.suppress(OSError):
                os.utime(self.root / name, follow_symlinks=False)
        else:
            self._remove(name)
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + SWEEP_EVERY_S
            self._sweeping = asyncio.create_task(self.sweep(), name="sweep scratch folders")

    async def write(self, job_id: str, name: str, text: str) -> Path:
        """Write ``text`` into the job's folder (entered: a task is about to start) as the
        file ``name`` (a safe file name), its account's alone; ``OSError`` if it cannot be."""
        path = self.root / safe_name(job_id) / name
        await _write(path, text.encode())
        return path

    async def close(self) -> None:
        """The agent stops: the sweep stops (the next agent sweeps at its first task's
        end) and removals under way finish."""
        if self._sweeping is not None:
            await cancel_and_wait(self._sweeping)
        await asyncio.gather(*self._removing.values())

    async def sweep(self) -> None:
        """Remove the folders no task here uses that have not been used for
        ``expire_after_s``."""
        oldest = time.time() - self._expire_after_s
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            log.warning("cannot sweep scratch folders in %s: %s", self.root, exc.strerror)
            return
        for name in names:
            with contextlib.suppress(OSError):
                if name not in self._using and os.lstat(self.root / name).st_mtime < oldest:
                    log.info("removing scratch folder %s: unused since its job ran here", name)
                    await asyncio.shield(self._remove(name))  # stopping the sweep stops no removal

    def _remove(self, name: str) -> asyncio.Task[None]:
        """The folder's removal, started now unless it is under way."""
        removing = self._removing.get(name)
        if removing is None:
            removing = asyncio.create_task(_remove(self.root / name), name=f"remove {name}")
            self._removing[name] = removing
            removing.add_done_callback(lambda _: self._removing.pop(name, None))
        return removing


async def _remove(path: Path) -> None:
    """Empty ``path`` as its owner, then remove it; what cannot be removed is logged."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(found.st_mode):
        try:
            path.unlink()
        except OSError as exc:
            log.warning("cannot remove %s: %s", path, exc.strerror)
        return
    identity = _as_owner(found)
    chmod, find = shutil.which("chmod", path=_TOOLS_PATH), shutil.which("find", path=_TOOLS_PATH)
    if chmod is None or find is None:
        log.warning("cannot remove scratch folder %s: no chmod or find in %s", path, _TOOLS_PATH)
        return
    # Never through a link: chmod -R ignores those it meets, find deletes links themselves.
    own = [chmod, "-R", "u+rwx", "--", str(path)]
    empty = [find, str(path), "-mindepth", "1", "-delete"]
    for argv in (own, empty):
        try:
            child = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": _TOOLS_PATH, "LC_ALL": "C"},
                cwd="/",
                **identity,
            )
            _, errors = await child.communicate()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("cannot remove scratch folder %s: %s", path, exc)
            return
        if child.returncode != 0:
            log.warning("scratch folder %s: %s", path, errors.decode(errors="replace").strip())
    try:
        path.rmdir()
    except OSError as exc:
        log.warning("cannot remove scratch folder %s: %s", path, exc.strerror)


async def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as the owner of its folder, readable by it alone: ``tee``
    runs as it, with a private umask."""
    tee = shutil.which("tee", path=_TOOLS_PATH)
    if tee is None:
        raise OSError(f"no tee in {_TOOLS_PATH}")
    try:
        child = await asyncio.create_subprocess_exec(
            tee,
            "--",
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": _TOOLS_PATH, "LC_ALL": "C"},
            cwd="/",
            umask=0o077,
            **_as_owner(os.lstat(path.parent)),
        )
        _, errors = await child.communicate(data)
    except subprocess.SubprocessError as exc:
        raise OSError(str(exc)) from exc
    if child.returncode != 0:  # tee names the file
        raise OSError(errors.decode(errors="replace").strip())


def _as_owner(found: os.stat_result) -> dict[str, Any]:
    """The subprocess options that run a child as the owner of what ``found`` describes
    (none when that is the agent)."""
    if found.st_uid == os.geteuid():
        return {}
    return {"user": found.st_uid, "group": found.st_gid, "extra_groups": []}
