"""Keeps the usage ledger and publishes its snapshots into the scheduler's input.

The ledger is folded by a group-less ``LogReader`` (every partition, from its latest
snapshot's offsets, else from offset 0, on each start), not by a faust agent: the
app's consumer group resumes from committed offsets and is shared with the
jobs and nodes agents, which must not be rewound. Every ``SNAPSHOT_EVERY`` records
folded, the ledger is snapshotted (``snapshots.py``), so a restart after a million
events folds only those since.

Every record of the events topic passes the gate first (``services.projector.trust``);
one it refuses is skipped (the nodes agent parks it). The ledger is judged on its own
state, not the nodes and jobs tables: the nodes' keys and the tasks' nodes it folded
itself, in log order (``libs.readmodels.usage``). The tables are the log as it is now,
so a rebuild from offset 0 would judge a node's old reports against a revocation made
since, and unmake charges placement made from them; judged on its own fold, the
ledger says the same of a log prefix whenever it is folded, as placement does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import UTC, datetime

from aiokafka.errors import KafkaError
from qm.v1 import events_pb2, snapshot_pb2

from libs.bus import Bus, KafkaBus, LogReader
from libs.bus.producer import TYPE_HEADER
from libs.events.snapshot import SnapshotError
from libs.trust import SigningKey
from services.projector import trust
from services.projector.app import KAFKA, TOPICS, app
from services.projector.usage import snapshots, state
from services.trust import signing_key_from_env

log = logging.getLogger(__name__)

PRODUCER = "projector"

# Where the ledger is read from (tests put a memory bus here).
BUS: Bus = KafkaBus(KAFKA)
# Records folded (events and decisions) between two snapshots of the ledger, and how
# often that is looked at.
SNAPSHOT_EVERY = 100_000
SNAPSHOT_CHECK_S = 30.0
events_out = app.topic(TOPICS.events.name, key_type=bytes, value_type=bytes)


@functools.cache
def signer() -> SigningKey:
    """The projector's key, which signs the snapshots it writes (``QM_EVENTS_KEY_FILE``)."""
    return signing_key_from_env("projector")


async def fold_events() -> None:
    """Fold the whole log, mark the ledger rebuilt, then keep folding as the log grows.

    Placement's decisions are folded too, for the one that changes a charge: a task
    lost with its node, whose end no agent reports; and for the knobs placement
    announces, which must be the ledger's.
    """
    signer()  # a missing or bad key stops the worker now, not at its first snapshot
    trust.gate()
    store = snapshots.LedgerSnapshots(BUS, TOPICS.usage_snapshots)
    start = await _restore(store)
    reader = LogReader(BUS, TOPICS.events.name, name="projector-usage-events")
    decisions = LogReader(BUS, TOPICS.decisions.name, name="projector-usage-decisions")
    await reader.start(start.events_offsets if start else None)
    await decisions.start(start.decisions_offsets if start else None)
    try:
        folded = await reader.catch_up_records(_fold_event)
        await decisions.catch_up(_fold_decision)
        log.info("usage ledger rebuilt from %d events", folded)
        if mismatch := state.placement.mismatch(PRODUCER):
            log.error("%s", mismatch)
        state.rebuilt.set()
        await asyncio.gather(
            reader.follow_records(_fold_event),
            decisions.follow(_fold_decision),
            _snapshot_every(store, reader, decisions, _folded(start)),
        )
    finally:
        await reader.stop()
        await decisions.stop()
        await store.stop()


async def _restore(store: snapshots.LedgerSnapshots) -> snapshot_pb2.LedgerSnapshot | None:
    """Load the latest snapshot into ``state``; the snapshot, or None to fold from 0."""
    snapshot = await store.latest()
    if snapshot is None:
        return None
    try:
        state.ledger, state.placement = snapshots.restore(snapshot, state.LEDGER_CONFIG)
    except SnapshotError as exc:
        log.warning("the usage ledger's snapshot is not loaded (%s): folding the log", exc)
        return None
    log.info("usage ledger loaded from its snapshot of %s", snapshot.taken_at.ToJsonString())
    return snapshot


def _folded(snapshot: snapshot_pb2.LedgerSnapshot | None) -> int:
    if snapshot is None:
        return 0
    return sum(snapshot.events_offsets.values()) + sum(snapshot.decisions_offsets.values())


async def _snapshot_every(
    store: snapshots.LedgerSnapshots, events: LogReader, decisions: LogReader, last: int
) -> None:
    """Snapshot the ledger whenever ``SNAPSHOT_EVERY`` more records have been folded.
    Taken between two polls (both readers apply a poll's records before they yield),
    so the offsets are exactly what the ledger has folded."""
    while True:
        folded = sum(events.offsets().values()) + sum(decisions.offsets().values())
        if folded - last >= SNAPSHOT_EVERY:
            snapshot = snapshots.take(
                state.ledger,
                state.placement,
                events=events.offsets(),
                decisions=decisions.offsets(),
                config=state.LEDGER_CONFIG,
                taken_at=datetime.now(UTC),
            )
            try:
                await store.save(snapshot)
            except KafkaError as exc:  # only a shortcut: the next round tries again
                log.warning("the usage ledger's snapshot was not written: %s", exc)
            else:
                last = folded
                log.info("usage ledger snapshot after %d records", folded)
        await asyncio.sleep(SNAPSHOT_CHECK_S)


def _fold_event(env: events_pb2.Envelope, record: bytes) -> None:
    """Fold one record of the events topic, if the gate lets it through."""
    refused = trust.gate().check(
        env,
        record,
        functools.partial(state.ledger.node_key, env.cluster),
        functools.partial(state.ledger.task_node, env.cluster),
    )
    if refused is not None:
        log.info("usage ledger skipped %s %s: %s", env.event_id, env.key_id, refused.parked())
        return
    state.ledger.apply(env)


def _fold_decision(env: events_pb2.Envelope) -> None:
    state.ledger.decided(env)
    # While catching up, announcements placement has since replaced go by unsaid.
    if state.placement.fold(env) and state.rebuilt.is_set():
        log.error("%s", state.placement.mismatch(PRODUCER))


# Registered by call: faust's decorators are untyped.
app.task(fold_events)


async def publish_snapshots() -> int:
    """Send each cluster's snapshot that changed since its last one; returns how many."""
    if not state.rebuilt.is_set():
        return 0
    sent = 0
    for env in state.ledger.snapshots_due(PRODUCER):
        try:
            delivery = await events_out.send(
                key=env.cluster.encode(),
                value=signer().seal(env),
                headers=[(TYPE_HEADER, b"usage_snapshot")],
            )
            await delivery
        except KafkaError as exc:
            # Not recorded as sent, so the next round tries again with fresher usage.
            log.warning("usage snapshot for %s not published: %s", env.cluster, exc)
            break
        state.ledger.sent(env)
        sent += 1
    return sent


app.timer(interval=state.SNAPSHOT_SECONDS)(publish_snapshots)
