"""What an allocation is owed, and how much longer than its best a job took: the two
service-level definitions the simulator's report and the live console share.

* Owed: an allocation with ``entitled_gpus`` (its entitlement times the capacity) is owed
  ``min(entitled_gpus, demand)`` GPUs at every moment, where demand is the GPUs its charged
  work holds plus those its charged waiting work asks for; delivered is what it holds.
* Slowdown: completion time over run time, the run time at least ``SLOWDOWN_FLOOR_S`` so
  that a short job's slowdown is not inflated by seconds of waiting. A workflow's, as
  Compass measures it: its latency over its best case (``Workflow.best_case_ms``).
"""

from __future__ import annotations

# Owed delivered at or above this, for every allocation owed anything: the target the
# simulator's report judges every trace by, and the line the console draws.
TARGET_DELIVERED_PCT = 97.0
SLOWDOWN_FLOOR_S = 10.0


def owed_gpus(entitled_gpus: float, held: int, asked: int) -> float:
    """GPUs owed now to an allocation holding ``held`` charged GPUs and asking ``asked``."""
    return min(entitled_gpus, held + asked)


def slowdown(completion_s: float, runtime_s: float) -> float:
    """How many times its (floored) run time a job took from submission to its end."""
    return completion_s / max(runtime_s, SLOWDOWN_FLOOR_S)


def workflow_slowdown(latency_ms: float, best_case_ms: float) -> float:
    """How many times its best case (no queueing, models resident) a workflow took."""
    return latency_ms / best_case_ms
