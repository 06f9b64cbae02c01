"""The usage ledger and its settings; in memory, rebuilt from the events topic on each start.

The window is ``QM_LOOKBACK_WINDOW_S`` (default: the policy file's, as placement's);
changed snapshots are published every ``QM_SNAPSHOT_SECONDS`` (see ``ProjectorSettings``).
"""

from __future__ import annotations

import asyncio

from libs.readmodels import UsageLedger
from services.projector.app import POLICY, SETTINGS

WINDOW_S = SETTINGS.lookback_window_s or POLICY.lookback_window_s
SNAPSHOT_SECONDS = SETTINGS.snapshot_seconds

# Read as ``state.ledger`` (not imported by name), so that tests can start afresh.
ledger = UsageLedger(WINDOW_S, POLICY.price)
# Set once the whole log, as it stood at start, is folded: until then the
# ledger undercharges, so nothing is published or served from it.
rebuilt = asyncio.Event()
