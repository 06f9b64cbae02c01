"""The installation's token keys, made in one folder (``python -m libs.auth keygen DIR``):

- ``issuer.key``: the user-token issuer, which may sign for anyone. It belongs with the
  operators' tooling (``qm token``, ``qm login``: ``QM_AUTH_SIGNING_KEY_FILE``), never
  on a node, the projector or the console.
- ``<service>.key`` for each service that calls others under its own identity
  (``SERVICE_SUBJECTS``: admission, the console), which may sign only for those.
- ``public-keys.yaml``: every service's ``QM_AUTH_PUBLIC_KEYS_FILE``, listing the public
  half of each with the subjects it may sign for (``libs.auth.tokens`` describes it).

Private keys are PEM (PKCS#8) files of mode 0600, the folder 0700. Idempotent: a key
already there is kept. To rotate one, delete its file and run it again: the new key is
listed and the old one stays in the list (which keeps every key it lists that is not
one of the folder's) until you drop it, once the tokens it signed have expired.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from libs.auth.keyfiles import make_private_key
from libs.auth.tokens import (
    ANY,
    KEYGEN_HINT,
    SERVICE_SUBJECTS,
    PublicKey,
    SigningKey,
    read_public_keys,
)

ISSUER = "issuer"
PUBLIC_KEYS = "public-keys.yaml"
HEADER = """\
# The keys Quartermaster's services check tokens with (QM_AUTH_PUBLIC_KEYS_FILE): public,
# not a secret. Each may sign tokens for the subjects it names ("*": anyone); a token's
# header names its key by fingerprint (kid). Made by `python -m libs.auth keygen`.
"""


@dataclass(frozen=True)
class Made:
    """What ``keygen`` did: each key's file and whether it is new; the public keys file;
    the keys of the old list it kept (rotated out, to drop later)."""

    keys: dict[Path, bool]
    public_keys: Path
    kept: tuple[PublicKey, ...]


def signers() -> dict[str, tuple[str, ...] | None]:
    """Each key's name and the subjects it may sign for (None: anyone)."""
    return {ISSUER: None, **SERVICE_SUBJECTS}


def keygen(folder: Path) -> Made:
    """Make the keys ``folder`` lacks, and write its public keys file."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    listed: list[PublicKey] = []
    made: dict[Path, bool] = {}
    for name, subjects in signers().items():
        path = folder / f"{name}.key"
        new = not path.exists()
        signer = SigningKey(make_private_key(path, "key", KEYGEN_HINT))
        listed.append(signer.public(subjects, name))
        made[path] = new
    public_keys = folder / PUBLIC_KEYS
    ours = {key.kid for key in listed}
    old = read_public_keys(public_keys) if public_keys.exists() else ()
    kept = tuple(key for key in old if key.kid not in ours)
    _write(public_keys, public_keys_text([*listed, *kept]).encode(), 0o644)
    return Made(made, public_keys, kept)


def described(made: Made) -> list[str]:
    """What ``keygen`` did, a line each, for people."""
    lines = []
    for (path, new), subjects in zip(made.keys.items(), signers().values(), strict=True):
        for_whom = "anyone" if subjects is None else ", ".join(subjects)
        lines.append(f"{path}: {'made' if new else 'kept'} (signs for {for_whom})")
    lines.append(f"{made.public_keys}: every service's QM_AUTH_PUBLIC_KEYS_FILE")
    lines += [
        f"  also lists {key} of before: drop it once the tokens it signed have expired"
        for key in made.kept
    ]
    return lines


def public_keys_text(keys: list[PublicKey]) -> str:
    """A public keys file listing ``keys``."""
    lines = [HEADER.rstrip("\n"), "keys:"]
    for key in keys:
        subjects = json.dumps(ANY if key.subjects is None else sorted(key.subjects))
        lines += [
            f"  # kid {key.kid}",
            f"  - name: {json.dumps(key.name)}",
            f"    subjects: {subjects}",
            "    public_key: |",
            *(f"      {line}" for line in key.pem().splitlines()),
        ]
    return "\n".join(lines) + "\n"


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode`` whatever the umask, replaced whole, never
    half written."""
    target = path.with_name(f".{path.name}.tmp")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), mode)
        file.write(data)
    target.replace(path)
