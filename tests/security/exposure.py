"""The security suite's checks that no secret is in reach: what a file or a log holds of
the installation's secrets (``found``), which files a task could open (``READER``, run as
the task's account, names them), and what a stack's logs hold (``logged``).

A secret is a token (a JWT: its header and payload are base64url JSON, each "eyJ..."), a
private key (PEM), or the content of a password file: the broker's SCRAM passwords and the
token keys' private halves. ("eyJ" alone is no token: "KeyJsonConverter" has it, in Kafka's jars.)
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from libs.telemetry.logs import TOKEN_PATTERN
from tests.integration.stack import Stack

TOKEN = re.compile(TOKEN_PATTERN.encode())  # what every service's log lines redact
PRIVATE_KEY = b"PRIVATE KEY-----"

# Run as the task's account with a file of paths: prints each path it could open to read.
READER = """
import sys
for path in open(sys.argv[1], encoding="utf-8").read().splitlines():
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError:
        continue
    print("readable", path, flush=True)
"""


@dataclass(frozen=True)
class Secrets:
    """The values no one but their owner may read, each by what it is."""

    values: dict[str, bytes]

    @classmethod
    def of(cls, password_files: Iterable[Path], signing_keys: Iterable[bytes]) -> Secrets:
        values = {f"password file {p}": p.read_bytes().strip() for p in password_files}
        values |= {f"signing key {n}": key for n, key in enumerate(signing_keys, start=1)}
        return cls({name: value for name, value in values.items() if value})

    @classmethod
    def of_stacks(cls, stacks: Iterable[Stack], *states: Path) -> Secrets:
        """Those of stacks on one broker (its accounts' passwords, each stack's key) and of
        the state folders ``states`` laid out as ``make up`` lays out ``.local``."""
        stacks = list(stacks)
        users = {file for stack in stacks for file in stack.users_dir.iterdir()}
        users |= {file for state in states for file in password_files(state)}
        return cls.of(sorted(users), (key for stack in stacks for key in stack.private_keys))


def password_files(state: Path) -> Iterator[Path]:
    """The password files of a state folder like ``.local``: each broker's accounts'
    (``kafka*/users/``) and the token keys' private halves (``auth/*.key``)."""
    yield from state.glob("kafka*/users/*")
    yield from state.glob("auth/*.key")


def found(content: bytes, secrets: Secrets) -> list[str]:
    """What secrets ``content`` holds, by name ([]: none)."""
    named = [name for name, value in secrets.values.items() if value in content]
    if TOKEN.search(content):
        named.append("a token (eyJ...)")
    if PRIVATE_KEY in content:
        named.append("a private key")
    return named


def files_under(*folders: Path) -> Iterator[Path]:
    """Every regular file under ``folders`` (as root sees them), links not followed."""
    for folder in folders:
        for parent, _, names in os.walk(folder):
            for name in names:
                path = Path(parent) / name
                try:
                    regular = stat.S_ISREG(path.lstat().st_mode)
                except FileNotFoundError:
                    continue  # gone since it was listed (a broker's segment, compacted)
                if regular:
                    yield path


def readable(reader_output: str) -> list[Path]:
    """The paths ``READER`` could open."""
    return [
        Path(line.removeprefix("readable "))
        for line in reader_output.splitlines()
        if line.startswith("readable ")
    ]


def exposed(paths: Iterable[Path], secrets: Secrets) -> dict[Path, list[str]]:
    """Of the files another account could open, those holding a secret, and which
    (read here, as their owner: what that account could have read)."""
    leaks = {}
    for path in paths:
        try:
            content = path.read_bytes()
        except OSError:
            continue  # gone since (a rotated log): nothing left to read
        if named := found(content, secrets):
            leaks[path] = named
    return leaks


def logged(stacks: Iterable[Stack], secrets: Secrets) -> dict[Path, list[str]]:
    """The logs of ``stacks`` (every service's and task's) and of their broker that hold
    a secret, and which."""
    stacks = list(stacks)
    brokers = {stack.users_dir.parent / "logs" for stack in stacks}
    folders = [stack.logs for stack in stacks] + [b for b in sorted(brokers) if b.is_dir()]
    return exposed(files_under(*folders), secrets)
