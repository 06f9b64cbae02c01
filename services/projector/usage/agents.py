"""Keeps the usage ledger and publishes its snapshots into the scheduler's input.

The ledger is folded by a group-less ``LogReader`` (every partition, from
offset 0 on each start, as the budget service does), not by a faust agent: the
app's consumer group resumes from committed offsets and is shared with the
jobs and nodes agents, which must not be rewound.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.errors import KafkaError
from qm.v1 import events_pb2

from libs.bus import Bus, KafkaBus, LogReader
from libs.bus.producer import TYPE_HEADER
from libs.events import encode
from services.projector.app import KAFKA, TOPICS, app
from services.projector.usage import state

log = logging.getLogger(__name__)

PRODUCER = "projector"

# Where the ledger is read from (tests put a memory bus here).
BUS: Bus = KafkaBus(KAFKA)
events_out = app.topic(TOPICS.events.name, key_type=bytes, value_type=bytes)


async def fold_events() -> None:
    """Fold the whole log, mark the ledger rebuilt, then keep folding as the log grows.

    Placement's decisions are folded too, for the one that changes a charge: a task
    lost with its node, whose end no agent reports; and for the knobs placement
    announces, which must be the ledger's.
    """
    reader = LogReader(BUS, TOPICS.events.name, name="projector-usage-events")
    decisions = LogReader(BUS, TOPICS.decisions.name, name="projector-usage-decisions")
    await reader.start()
    await decisions.start()
    try:
        folded = await reader.catch_up(state.ledger.apply)
        await decisions.catch_up(_fold_decision)
        log.info("usage ledger rebuilt from %d events", folded)
        if mismatch := state.placement.mismatch(PRODUCER):
            log.error("%s", mismatch)
        state.rebuilt.set()
        await asyncio.gather(reader.follow(state.ledger.apply), decisions.follow(_fold_decision))
    finally:
        await reader.stop()
        await decisions.stop()


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
                value=encode(env),
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
