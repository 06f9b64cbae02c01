"""Which commits made each policy version: read from docs/policy-versions.md.

Decisions name the release that made them (``provenance.release``) since version 34;
a log from before names only its version, and the changelog's line for that version
names the commits it ran from (``- **33** (commits 4e665a7 to 87063b0): ...``). Any of
them decides the same inputs alike; the last is the one to audit with.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parents[2] / "docs" / "policy-versions.md"
_LINE = re.compile(r"^- \*\*(\d+)\*\* \(commits ([0-9a-f]{7,40}) to ([0-9a-f]{7,40})\)", re.M)


def policy_commits(version: int) -> tuple[str, str] | None:
    """The first and last commit of ``version``; None when the changelog names none
    (a version whose decisions name their release, or a build without the document)."""
    return _commits().get(version)


@functools.cache
def _commits() -> dict[int, tuple[str, str]]:
    try:
        text = CHANGELOG.read_text(encoding="utf-8")
    except OSError:
        return {}
    return {int(v): (first, last) for v, first, last in _LINE.findall(text)}
