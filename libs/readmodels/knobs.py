"""Placement's knobs as its decisions topic announces them, against a reader's own.

A service that folds the log under some of the policy's knobs (the projector's usage
ledger: the lookback window and the GPU prices) computes something else than placement
if its values differ; this names the knobs that do. Placement announces its knobs per
input partition (``PolicyConfigured``) whenever it builds that partition's state, so
the latest announcement of each partition is what placement decides under now.
"""

from __future__ import annotations

from collections.abc import Collection

from qm.v1 import events_pb2

from libs.core import KnobDifference, PolicyConfig, knob_differences
from libs.events import event_type


class PlacementKnobs:
    """Fold the decisions topic; :meth:`differences` says where placement's knobs are not ours."""

    def __init__(self, mine: PolicyConfig, names: Collection[str]) -> None:
        self._mine = mine
        self._names = tuple(names)
        self._by_partition: dict[int, tuple[KnobDifference, ...]] = {}

    def fold(self, env: events_pb2.Envelope) -> tuple[KnobDifference, ...] | None:
        """Fold one decisions record: an announcement gives how it differs (``()``: it
        agrees), anything else ``None``."""
        if event_type(env) != "policy_configured":
            return None
        announced = env.policy_configured
        found = knob_differences(announced.knobs, self._mine, self._names)
        self._by_partition[announced.input_partition] = found
        return found

    def differences(self) -> tuple[KnobDifference, ...]:
        """How placement's latest knobs differ from ours, over all partitions, by name."""
        found = {d for differences in self._by_partition.values() for d in differences}
        return tuple(sorted(found, key=lambda d: (d.name, d.theirs or "")))

    def mismatch(self, mine: str) -> str:
        """One line naming each differing knob (empty if none); ``mine`` names our side."""
        found = self.differences()
        if not found:
            return ""
        knobs = "; ".join(d.describe("placement", mine) for d in found)
        return f"placement decides under other knobs than the {mine}: {knobs}"
