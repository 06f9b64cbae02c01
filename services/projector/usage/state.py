"""The usage ledger and its settings; in memory, rebuilt from the events topic on each start.

The window is ``QM_LOOKBACK_WINDOW_S`` (default: the policy file's, as placement's);
changed snapshots are published every ``QM_SNAPSHOT_SECONDS`` (see ``ProjectorSettings``).

The window and the GPU prices must be placement's. They are checked against the knobs
placement announces on the decisions topic, not taken from there: the ledger expires
usage as its window slides and publishes snapshots into the scheduler's input, so a
window adopted from the other topic would make each snapshot depend on when that topic
was read, and a change would need a refold from the start. A mismatch is logged as an
error and served on ``/config`` (409) instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from libs.readmodels import PlacementKnobs, UsageLedger
from services.projector.app import POLICY, SETTINGS

WINDOW_S = SETTINGS.lookback_window_s or POLICY.lookback_window_s
SNAPSHOT_SECONDS = SETTINGS.snapshot_seconds
# The knobs the ledger folds with, and their values here.
LEDGER_KNOBS = ("lookback_window_s", "gpu_prices")
LEDGER_CONFIG = replace(POLICY, lookback_window_s=WINDOW_S)

# Read as ``state.ledger`` (not imported by name), so that tests can start afresh.
ledger = UsageLedger(WINDOW_S, POLICY.price)
# Set once the whole log, as it stood at start, is folded: until then the
# ledger undercharges, so nothing is published or served from it.
rebuilt = asyncio.Event()
# Read as ``state.placement`` too: whether placement's knobs are the ledger's.
placement = PlacementKnobs(LEDGER_CONFIG, LEDGER_KNOBS)
