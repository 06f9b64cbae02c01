"""The usage ledger and its settings; in memory, rebuilt from the events topic on each start.

``QM_LOOKBACK_WINDOW_S`` sets the window (default: the policy file's, as placement) and
``QM_SNAPSHOT_SECONDS`` how often changed snapshots are published (default 10).
"""

from __future__ import annotations

import asyncio
import os

from libs.readmodels import UsageLedger
from services.policy_file import policy_from_env


def _positive(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw is not None else default
    except ValueError:
        value = -1.0
    if not value > 0:  # also refuses nan
        raise ValueError(f"{name} must be a positive number of seconds, not {raw!r}")
    return value


WINDOW_S = _positive("QM_LOOKBACK_WINDOW_S", policy_from_env().lookback_window_s)
SNAPSHOT_SECONDS = _positive("QM_SNAPSHOT_SECONDS", 10.0)

# Read as ``state.ledger`` (not imported by name), so that tests can start afresh.
ledger = UsageLedger(WINDOW_S, policy_from_env().price)
# Set once the whole log, as it stood at start, is folded: until then the
# ledger undercharges, so nothing is published or served from it.
rebuilt = asyncio.Event()
