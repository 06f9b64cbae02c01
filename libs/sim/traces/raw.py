"""A trace job as the trace states it, before teams and contracts are assigned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


class _Submitted(Protocol):
    @property
    def at(self) -> float: ...


J = TypeVar("J", bound=_Submitted)


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
