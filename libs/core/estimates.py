"""Runtime estimates, for planning only (reservations, backfill), never for charging.

A job's estimate is the limit its spec requests (its user's or its trace's), else its
time limit (it runs no longer), else one learned from its user's completed jobs, else
none. The learned figure is the 80th percentile (nearest rank) of the user's last
``LEARNED_JOBS`` completed runtimes: a percentile is not dragged by the odd runaway or
instant crash as a mean is, leaning high means a plan errs towards waiting rather than
delaying a reservation, and a short window follows a user whose work changes. The
runtimes are scheduler state (in the digest), fed from the job ends the scheduler sees.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from libs.core.model import JobSpec
from libs.core.state import State, Table

LEARNED_JOBS = 20  # completed runtimes kept per user
LEARNED_PERCENTILE = 0.8

Learned = Mapping[str, tuple[float, ...]]  # user -> runtimes of their latest completed jobs


@functools.lru_cache(maxsize=4096)
def learned_s(runtimes: tuple[float, ...]) -> float | None:
    """The nearest-rank percentile of ``runtimes``; None when there are none. Memoized
    (a pure function of the tuple): a pass asks it of every job it looks at."""
    if not runtimes:
        return None
    ordered = sorted(runtimes)
    return ordered[math.ceil(LEARNED_PERCENTILE * len(ordered)) - 1]


def estimate_s(spec: JobSpec, learned: Learned) -> float | None:
    """How long the job is expected to run: its requested limit, else its time limit,
    else its user's learned figure, else None (unknown)."""
    if spec.runtime_estimate_s > 0:
        return spec.runtime_estimate_s
    if spec.time_limit_s > 0:
        return float(spec.time_limit_s)
    return learned_s(learned.get(spec.user, ()))


class LearnedRuntimes:
    """Each user's latest completed runtimes, oldest first."""

    def __init__(self, state: State) -> None:
        self.runtimes: Table[str, tuple[float, ...]] = state.table("learned_runtimes")

    def completed(self, user: str, runtime_s: float) -> None:
        kept = self.runtimes.get(user, ())[-(LEARNED_JOBS - 1) :]
        self.runtimes[user] = (*kept, runtime_s)

    def estimate_s(self, spec: JobSpec) -> float | None:
        return estimate_s(spec, self.runtimes)
