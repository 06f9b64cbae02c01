"""``qm secret set USER NAME``: put a secret in a node's store, for ``qm submit --secret``.

An operator tool for a store on this machine (``QM_SECRETS_DIR``; the local stack's
``.local/secrets``): the value is read from stdin, never from the command line, which
other users can see in ``ps``. Kubernetes mounts a Secret instead (deploy/k8s/README.md).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.groups import group
from cli.render import fail

secret_app = group("Operator tools for the secret store.")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@secret_app.command("set")
def secret_set(
    user: Annotated[str, typer.Argument(help="Whose secret it is")],
    name: Annotated[str, typer.Argument(help="Its name: the variable the task gets")],
) -> None:
    """Store stdin as USER's secret NAME (readable by the node agent only)."""
    root = Path(os.environ.get("QM_SECRETS_DIR") or Path(".local") / "secrets")
    try:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r}: a name of letters, digits and _ (not first a digit)")
        if not user or user.startswith(".") or "/" in user:
            raise ValueError(f"{user!r} cannot name a folder of the store")
        value = sys.stdin.read().rstrip("\n")
        # A store made here is the owner's alone; an existing one is left as it is.
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = root / user
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(value)
    except (ValueError, OSError) as exc:
        raise fail(exc) from exc
    print(f"stored {user}'s secret {name} in {path}")
