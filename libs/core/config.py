"""The policy's knobs. Part of the replay contract: auditors must use the same values."""

from __future__ import annotations

from dataclasses import dataclass

DAY = 86_400.0
HOUR = 3_600.0


@dataclass(frozen=True)
class PolicyConfig:
    lookback_window_s: float = 7 * DAY
    max_min_runtime_s: float = 8 * HOUR
    # Running work counts toward its allocation's usage this far ahead, so that
    # a pass that just placed work for an allocation ranks it accordingly.
    running_horizon_s: float = HOUR
    # Debug jobs may preempt to start; the reference system's p90 target is 30 s.
    debug_preempts: bool = True
