"""Which folders a task's account can use: the kernel's permission rule for a path, as a
pure function of what ``stat`` says, for the task's ``PATH``, its home and the scratch
folder.

A task runs with its account's uid and primary group only (no supplementary groups), so
a folder is searchable when the class the kernel picks allows it: the owner's bits for
the owner (even if others may more), else the group's for its group, else the others'.
A path is usable when every folder from ``/`` down to it exists and is searchable.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

FALLBACK_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
SEARCH, WRITE = 0o1, 0o2  # one class's bits


@dataclass(frozen=True)
class Folder:
    """What ``stat`` says of a path, as far as permissions go."""

    mode: int  # st_mode, its type bits included
    uid: int
    gid: int

    @classmethod
    def of(cls, found: os.stat_result) -> Folder:
        return cls(found.st_mode, found.st_uid, found.st_gid)


# A path (resolved: no links in it) -> what is there, None if nothing is.
Look = Callable[[str], Folder | None]


@dataclass(frozen=True)
class Ids:
    """Whom the kernel checks: a uid and its groups."""

    uid: int
    gids: frozenset[int]


def allows(folder: Folder, ids: Ids, bits: int) -> bool:
    """Whether ``ids`` get ``bits`` (``SEARCH``, ``WRITE`` or both) on a folder."""
    if not stat.S_ISDIR(folder.mode):
        return False
    if folder.uid == ids.uid:
        shift = 6
    elif folder.gid in ids.gids:
        shift = 3
    else:
        shift = 0
    return (folder.mode >> shift) & bits == bits


def reachable(path: str, ids: Ids, look: Look, bits: int = SEARCH) -> bool:
    """Whether ``path`` (absolute, resolved) and every folder above it exist and are
    searchable by ``ids``, and ``path`` itself allows ``bits`` too."""
    folder = PurePosixPath(path)
    if not folder.is_absolute() or ".." in folder.parts:
        return False
    for above in [*reversed(folder.parents), folder]:
        found = look(str(above))
        if found is None or not allows(found, ids, bits if above == folder else SEARCH):
            return False
    return True


def usable_path(
    entries: Iterable[str], ids: Ids, look: Look, resolve: Callable[[str], str]
) -> list[str]:
    """The entries of a ``PATH`` that ``ids`` can search (each once, in order); if none,
    those of ``FALLBACK_PATH``. Relative and empty entries (the task's working
    directory, whatever it is) are dropped; ``resolve`` follows links."""
    kept = [
        e for e in dict.fromkeys(entries) if e.startswith("/") and _usable(e, ids, look, resolve)
    ]
    if kept:
        return kept
    return [e for e in FALLBACK_PATH if _usable(e, ids, look, resolve)]


def _usable(entry: str, ids: Ids, look: Look, resolve: Callable[[str], str]) -> bool:
    return reachable(resolve(entry), ids, look)


def look_up(path: str) -> Folder | None:
    """What is at ``path`` on this machine (links followed), None if nothing."""
    try:
        return Folder.of(os.stat(path))
    except OSError:
        return None
