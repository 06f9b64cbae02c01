"""What an allocation is owed, and how much longer than its best a job took: the
service-level definitions the simulator's report, the live console, the projector's
metrics and the core's own view (``Occupancy``) share.

* Waiting: a job is waiting from its submission until it is placed (held or not, and
  waiting for other jobs or not).
* Demand: the GPUs an allocation's charged work holds (a GPU workflow serving holds
  counts for the allocation it is charged to, busy or idle) plus those its charged
  waiting work asks for; a job no placement on the cluster could ever serve
  (``could_place``) asks for nothing.

* Owed: an allocation with ``entitled_gpus`` (its entitlement times the capacity) is owed
  ``min(entitled_gpus, demand)`` GPUs at every moment, where demand is the GPUs its charged
  work holds plus those its charged waiting work asks for; delivered is what it holds.
* The headline over many allocations (``headline``): the worst delivered ÷ owed over
  those owed at least ``SMALL_TEAM_OWED_FRACTION`` of the cluster's GPU-time in the
  window; the smaller ones reported apart (how many, their share of all owed, their
  worst), never dropped silently; and Σ min(delivered, owed) ÷ Σ owed over everyone.
  A team owed a few seconds of work gets r ÷ (w + r) of it, whatever the policy: the
  floor keeps such a team from being the headline (issue 19's decision).
* Slowdown: completion time over run time, the run time at least ``SLOWDOWN_FLOOR_S`` so
  that a short job's slowdown is not inflated by seconds of waiting. A workflow's, as
  Compass measures it: its latency over its best case (``Workflow.best_case_ms``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

# Owed delivered at or above this, for every allocation owed anything: the target the
# simulator's report judges every trace by, and the line the console draws.
TARGET_DELIVERED_PCT = 97.0
SLOWDOWN_FLOOR_S = 10.0
# An allocation owed less than this share of the cluster's GPU-time over the measured
# window (or day) is a small team: reported apart from the worst team's figure.
SMALL_TEAM_OWED_FRACTION = 0.001


@dataclass(frozen=True)
class SmallTeams:
    """The allocations under the floor: how many, their share of everything owed (in
    percent), and the worst delivered ÷ owed among them (None: none)."""

    count: int = 0
    owed_pct: float = 0.0
    min_pct: float | None = None


@dataclass(frozen=True)
class Headline:
    """What every report leads with (``headline``)."""

    min_pct: float | None  # the worst delivered ÷ owed over the teams at the floor or above
    weighted_pct: float | None  # Σ min(delivered, owed) ÷ Σ owed, over every team
    small_teams: SmallTeams


def small_team(owed: float, capacity: float) -> bool:
    """Whether an allocation owed ``owed`` is under the floor of ``capacity``, the
    cluster's GPU-time over the same stretch (in the same unit); owed nothing, it is none."""
    return 0 < owed < SMALL_TEAM_OWED_FRACTION * capacity


def headline(levels: Iterable[tuple[float, float]], capacity: float) -> Headline:
    """The headline of allocations' (owed, delivered), in the unit of ``capacity``: the
    cluster's GPU-time over the same stretch. None where nothing was owed."""
    owed = [(o, d) for o, d in levels if o > 0]
    small = [(o, d) for o, d in owed if small_team(o, capacity)]
    total = sum(o for o, _ in owed)
    return Headline(
        min_pct=min((100 * d / o for o, d in owed if not small_team(o, capacity)), default=None),
        weighted_pct=100 * sum(min(o, d) for o, d in owed) / total if total else None,
        small_teams=SmallTeams(
            count=len(small),
            owed_pct=100 * sum(o for o, _ in small) / total if total else 0.0,
            min_pct=min((100 * d / o for o, d in small), default=None),
        ),
    )


@dataclass(frozen=True)
class Occupancy:
    """The cluster at one moment as the service levels count it, whoever read it (the
    core from its state, the console and the metrics from the projector's views)."""

    capacity: int  # GPUs on nodes not lost
    busy: int  # of those, held by tasks or workflow serving
    waiting: Mapping[str, int] = field(default_factory=dict)  # jobs, by allocation
    held: Mapping[str, int] = field(default_factory=dict)  # charged GPUs held
    asked: Mapping[str, int] = field(default_factory=dict)  # charged GPUs waiting

    def demand(self, allocation: str) -> int:
        """What the allocation is owed up to: ``min(entitled, demand)`` (``owed_gpus``)."""
        return self.held.get(allocation, 0) + self.asked.get(allocation, 0)


class Asking(NamedTuple):
    """A waiting job, as demand counts it."""

    allocation: str
    charged: bool
    gpus: int
    gpu_type: str


def waiting_and_asked(
    jobs: Iterable[Asking], room: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per allocation, its waiting ``jobs`` and the GPUs its charged ones ask for (those
    some placement on ``room``, the live GPUs by type, could serve)."""
    capacity = sum(room.values())
    waiting: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    for job in jobs:
        waiting[job.allocation] += 1
        if job.charged and could_place(job.gpus, job.gpu_type, room, capacity):
            asked[job.allocation] += job.gpus
    return dict(waiting), dict(asked)


def gpu_states(capacity: int, busy: int, idle: int, warm: int, lost: int) -> dict[str, int]:
    """Every GPU in one state (the metric ``qm_gpus``), from GPUs on live nodes
    (``capacity``), those held (``busy``), of those the idle ones (``idle``), of those
    the ones serving holds with no task running (``warm``), and those on lost nodes: a
    task's (``busy`` or ``idle``), serving's idle ones (``serving``), ``free``, ``lost``."""
    return {
        "busy": busy - idle,
        "idle": idle - warm,
        "serving": warm,
        "free": capacity - busy,
        "lost": lost,
    }


def could_place(gpus: int, gpu_type: str, room: Mapping[str, int], capacity: int) -> bool:
    """Whether some placement on the nodes not lost (``room``: their GPUs by type,
    ``capacity``: all of them) could give a job ``gpus`` GPUs of ``gpu_type`` (any type
    when empty): a job that no scheduler could serve is no demand."""
    return 1 <= gpus <= (room.get(gpu_type, 0) if gpu_type else capacity)


def owed_gpus(entitled_gpus: float, held: int, asked: int) -> float:
    """GPUs owed now to an allocation holding ``held`` charged GPUs and asking ``asked``."""
    return min(entitled_gpus, held + asked)


def slowdown(completion_s: float, runtime_s: float) -> float:
    """How many times its (floored) run time a job took from submission to its end."""
    return completion_s / max(runtime_s, SLOWDOWN_FLOOR_S)


def workflow_slowdown(latency_ms: float, best_case_ms: float) -> float:
    """How many times its best case (no queueing, models resident) a workflow took."""
    return latency_ms / best_case_ms
