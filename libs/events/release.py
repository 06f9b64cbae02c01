"""Which release this build is: what placement's decisions name, so that an auditor
holding a log knows which code decided it.

A release is the package's version and the commit it was built from, as a PEP 440
local version: ``0.1.0+g87063b0a1b2c`` (``.dirty`` when the checkout had changes).
An image has no checkout: its build passes the release in (``QM_RELEASE``, a build
argument of deploy/Dockerfile). Without either, the version alone.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

RELEASE_ENV = "QM_RELEASE"
PACKAGE = "quartermaster"
# Every decision carries it: short, and of the characters a version string uses.
MAX_RELEASE_CHARS = 128
_RELEASE = re.compile(rf"[0-9A-Za-z.+_-]{{1,{MAX_RELEASE_CHARS}}}")
_SOURCE = Path(__file__).resolve().parents[2]


@functools.cache
def current() -> str:
    """This process's release (read once: it cannot change under a running process).
    Raises ValueError for a ``QM_RELEASE`` that is not a version string."""
    named = os.environ.get(RELEASE_ENV, "").strip()
    if named:
        if not _RELEASE.fullmatch(named):
            raise ValueError(
                f"{RELEASE_ENV}={named[:40]!r}{'...' if len(named) > 40 else ''}: give a "
                f"version and commit of at most {MAX_RELEASE_CHARS} letters, digits and "
                ".+_- (e.g. 0.1.0+g87063b0e223f), or leave it unset"
            )
        return named
    version = metadata.version(PACKAGE)
    commit = _checkout_commit()
    return f"{version}+g{commit}" if commit else version


def _checkout_commit() -> str | None:
    """The commit of the checkout this code runs from, if it runs from one."""
    if not (_SOURCE / ".git").exists():
        return None
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--abbrev=12", "--dirty=.dirty", "--exclude=*"],
            cwd=_SOURCE,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return described or None
