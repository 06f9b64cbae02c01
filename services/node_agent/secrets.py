"""The node's secret store: where a task's ``--secret NAME`` values come from.

A folder (``QM_SECRETS_DIR``; the local stack's is ``.local/secrets``) with one file per
user and name, ``<folder>/<user>/<NAME>``, readable only by the agent: a task runs as its
user's account and reaches none of it. Only the names travel with a job; the agent reads
the values when the task starts, for the job's own user, so that nobody can ask for
another user's secret. In Kubernetes the folder is a mounted Secret (see deploy/k8s).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path


class MissingSecret(Exception):
    """A secret the task asks for is not in this node's store; the message says which."""


class SecretStore:
    def __init__(self, root: Path | None) -> None:
        self._root = root

    @classmethod
    def from_env(cls) -> SecretStore:
        root = os.environ.get("QM_SECRETS_DIR")
        return cls(Path(root) if root else None)

    def values(self, user: str, names: Sequence[str]) -> dict[str, str]:
        """Each named secret of ``user``; ``MissingSecret`` for the first one absent."""
        if not names:
            return {}
        if self._root is None:
            raise MissingSecret("this node has no secret store (QM_SECRETS_DIR is not set)")
        if not user or user.startswith(".") or "/" in user or "\0" in user:
            raise MissingSecret(f"no secrets for user {user!r}")
        found = {}
        for name in names:
            path = self._root / user / name  # names are variable names (validated)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as file:
                    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                        raise OSError("not a file")
                    found[name] = file.read().decode().rstrip("\n")
            except (OSError, UnicodeDecodeError):
                raise MissingSecret(
                    f"secret {name} of {user} is not in this node's store ({self._root}/{user}/)"
                ) from None
        return found
