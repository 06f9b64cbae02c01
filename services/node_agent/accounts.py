"""A local account a task runs as (``sandbox.py`` resolves them; kept light for the
task's keeper, which imports it as it starts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Account:
    """A local account a task runs as."""

    name: str
    uid: int
    gid: int
    home: str
