"""Placement's knobs as announced on the decisions topic, against a reader's own."""

from __future__ import annotations

from qm.v1 import events_pb2

from libs.core import KnobDifference, PolicyConfig
from libs.events import new_envelope
from libs.events.log_step import policy_configured
from libs.readmodels import PlacementKnobs

INPUT = new_envelope(events_pb2.ClockTick(), producer="ticker", event_id="e")


def announced(config: PolicyConfig, partition: int) -> events_pb2.Envelope:
    return policy_configured(config, INPUT, partition=partition, offset=0)


def test_only_the_latest_announcement_of_each_partition_counts() -> None:
    mine = PolicyConfig()
    knobs = PlacementKnobs(mine, ["lookback_window_s", "gpu_prices"])
    assert knobs.fold(INPUT) is None and knobs.mismatch("ledger") == ""
    day = PolicyConfig(lookback_window_s=86_400, node_lost_timeout_s=5)  # the latter unused here
    assert knobs.fold(announced(day, 0)) == (
        KnobDifference("lookback_window_s", "86400.0", "604800.0"),
    )
    assert knobs.fold(announced(mine, 1)) == ()
    assert knobs.mismatch("ledger") == (
        "placement decides under other knobs than the ledger: "
        "lookback_window_s: placement 86400.0, ledger 604800.0"
    )
    knobs.fold(announced(PolicyConfig(node_lost_timeout_s=5), 0))  # placement restarted
    assert knobs.differences() == ()
