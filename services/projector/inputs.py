"""The topics the projector reads, and decoding and the trust gate, with
dead-lettering, in between."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import faust
from qm.v1 import events_pb2

from libs.bus import deadletter
from libs.events import DecodeError, decode, event_type
from services.projector import trust
from services.projector.app import APP_ID, TOPICS, app

log = logging.getLogger(__name__)

# Raw bytes in: decoding is ours, so a bad record can be dead-lettered instead of
# crashing the agent. allow_empty lets tombstones through to be dead-lettered too.
log_topics = app.topic(
    TOPICS.events.name,
    TOPICS.decisions.name,
    key_type=bytes,
    value_type=bytes,
    allow_empty=True,
)
deadletters = app.topic(TOPICS.deadletter.name, key_type=bytes, value_type=bytes)


async def envelopes(
    stream: faust.StreamT[bytes], *, consumer: str, parks_untrusted: bool = False
) -> AsyncIterator[events_pb2.Envelope]:
    """Decoded envelopes of ``stream`` that the gate lets through (``trust``);
    undecodable records are parked and skipped, refused ones skipped.

    Each agent dead-letters an undecodable record on its own account (``consumer``
    names it), as every consumer of the log does. A refused record is parked once, by
    the agent that ``parks_untrusted`` (the nodes agent, which keeps the nodes' keys the
    gate judges by): every agent checks every record, so the others only skip it.
    """
    consumer = f"{APP_ID}.{consumer}"
    trust.gate()  # a missing or bad trust file stops the worker now, not at a record
    async for event in stream.events():
        try:
            env = decode(event.value)
        except DecodeError as exc:
            await _dead_letter(event, reason=str(exc), consumer=consumer)
            continue
        if trust.is_signed(event.message.topic):
            refused = trust.refusal(env, event.value)
            if refused is not None:
                if parks_untrusted:
                    await _dead_letter(event, reason=refused.parked(), consumer=consumer)
                else:
                    log.info(
                        "%s skipped %s %s: %s",
                        consumer,
                        event_type(env),
                        env.event_id,
                        refused.parked(),
                    )
                continue
        yield env


async def _dead_letter(event: faust.EventT[bytes], *, reason: str, consumer: str) -> None:
    message = event.message
    headers = deadletter.headers(message, reason=reason, consumer=consumer)
    await deadletters.send(key=message.key, value=message.value, headers=headers)
    log.warning(
        "%s dead-lettered %s[%d]@%d: %s",
        consumer,
        message.topic,
        message.partition,
        message.offset,
        reason,
    )
