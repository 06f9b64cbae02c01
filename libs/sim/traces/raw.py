"""A trace job as the trace states it, before teams and contracts are assigned."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar


class TraceError(ValueError):
    """A trace file is not in the expected format; the message names the row."""


@dataclass(frozen=True)
class RawJob:
    job_id: str
    at: float  # submission, seconds from the trace's own origin
    user: str  # the key that picks the team; the pod itself where a trace has no users
    gpus: int
    runtime_s: float
    nodes: int = 1  # as recorded; the scheduler chooses its own spread
    best_effort: bool | None = None  # None: the trace does not say
    priority: int | None = None  # None: the trace does not say
    # The runtime limit the user asked for: for planning only, never for charging.
    requested_s: float | None = None
    status: str | None = None  # how the job ended in the trace (Pass, Failed, Killed, ...)
    team: str | None = None  # a budget-tree leaf, where the trace names it
    gpu_type: str | None = None  # None: any type


class _Submitted(Protocol):
    @property
    def at(self) -> float: ...


J = TypeVar("J", bound=_Submitted)
V = TypeVar("V")


def load_csv(path: Path, parse: Callable[[Iterable[str]], list[RawJob]]) -> list[RawJob]:
    """A CSV trace file through its parser (any line endings: the DIR-LAB files are CRLF)."""
    with path.open(newline="") as f:
        return parse(f)


def csv_rows(lines: Iterable[str], columns: Sequence[str]) -> tuple[csv.DictReader[str], list[str]]:
    """A CSV reader over ``lines`` and the ``columns`` its header lacks."""
    reader = csv.DictReader(lines)
    return reader, [c for c in columns if c not in (reader.fieldnames or ())]


def cell(row: Mapping[str, str | None], column: str, kind: Callable[[str], V], line: int) -> V:
    """``row[column]`` as ``kind``; a bad or missing value is a ``TraceError`` naming both."""
    text = (row.get(column) or "").strip()
    try:
        return kind(text)
    except ValueError:
        raise TraceError(
            f"row {line}, column {column}: expected {_KINDS.get(kind, 'text')}, got {text!r}"
        ) from None


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


_KINDS: dict[object, str] = {
    float: "a number",
    count: "a whole number >= 0",
    seconds: "seconds >= 0",
}


def select(
    jobs: Sequence[J],
    *,
    skip_head: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
) -> list[J]:
    """Drop the first ``skip_head`` jobs, then keep those submitted in [start_s, end_s)."""
    return [
        job
        for job in jobs[skip_head:]
        if (start_s is None or job.at >= start_s) and (end_s is None or job.at < end_s)
    ]
