"""The usage ledger's snapshots: the ledger, and placement's knobs as announced, at the
offsets of the events and decisions topics it has folded, on a compacted topic of its
own (one record, the latest), so a restarted projector folds only what follows them.

A snapshot is loaded only under the knobs it was taken under and if its state hashes
to its digest; otherwise the projector folds the log from the start, as it would
without one. Unpickling admits the ledger's own classes only (``libs.events.snapshot``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import datetime

from google.protobuf.message import DecodeError
from qm.v1 import snapshot_pb2

from libs.bus import Bus, TopicSpec
from libs.bus.compacted import CompactedTopic
from libs.core import PolicyConfig, config_digest
from libs.events.snapshot import SnapshotError, pack, unpack
from libs.readmodels import PlacementKnobs, UsageLedger

log = logging.getLogger(__name__)

# 2: the ledger keeps the nodes' keys and tasks' nodes its gate judges by, and folded
# only the records the gate let through; a format 1 snapshot is refolded from the log.
FORMAT = 2
KEY = b"usage-ledger"
# What a ledger's state may name: its classes, the core's usage, and protobuf messages.
PACKAGES = ("libs.readmodels", "libs.core", "qm.v1", "google.protobuf.timestamp_pb2")


def take(
    ledger: UsageLedger,
    knobs: PlacementKnobs,
    *,
    events: Mapping[int, int],
    decisions: Mapping[int, int],
    config: PolicyConfig,
    taken_at: datetime,
) -> snapshot_pb2.LedgerSnapshot:
    state = pack((ledger, knobs))
    snapshot = snapshot_pb2.LedgerSnapshot(
        events_offsets=dict(events),
        decisions_offsets=dict(decisions),
        config_digest=config_digest(config),
        format=FORMAT,
        state=state,
        state_digest=hashlib.sha256(state).digest(),
    )
    snapshot.taken_at.FromDatetime(taken_at)
    return snapshot


def restore(
    snapshot: snapshot_pb2.LedgerSnapshot, config: PolicyConfig
) -> tuple[UsageLedger, PlacementKnobs]:
    """The ledger and knobs ``snapshot`` holds, priced as ``config`` prices GPU-seconds;
    raises :class:`SnapshotError`."""
    if snapshot.format != FORMAT:
        raise SnapshotError(f"format {snapshot.format}; this projector reads format {FORMAT}")
    if snapshot.config_digest != config_digest(config):
        raise SnapshotError("taken under other knobs (config digest differs)")
    if hashlib.sha256(snapshot.state).digest() != snapshot.state_digest:
        raise SnapshotError("its state does not hash to its digest")
    loaded = unpack(snapshot.state, PACKAGES)
    match loaded:
        case (UsageLedger() as ledger, PlacementKnobs() as knobs):
            ledger.priced(config.price)
            return ledger, knobs
    raise SnapshotError("its state is not a usage ledger and placement's knobs")


class LedgerSnapshots:
    def __init__(self, bus: Bus, topic: TopicSpec) -> None:
        self._topic = CompactedTopic(bus, topic, client_id="projector-usage-snapshots")

    async def save(self, snapshot: snapshot_pb2.LedgerSnapshot) -> None:
        await self._topic.put(KEY, snapshot.SerializeToString())

    async def latest(self) -> snapshot_pb2.LedgerSnapshot | None:
        value = (await self._topic.latest()).get(KEY)
        if value is None:
            return None
        try:
            return snapshot_pb2.LedgerSnapshot.FromString(value)
        except DecodeError:
            log.warning("the usage ledger's snapshot record does not decode; folding the log")
            return None

    async def stop(self) -> None:
        await self._topic.stop()
