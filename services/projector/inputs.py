"""The topics the projector reads, and decoding with dead-lettering in between."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import faust
from qm.v1 import events_pb2

from libs.bus import deadletter
from libs.events import DecodeError, decode
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
    stream: faust.StreamT[bytes], *, consumer: str
) -> AsyncIterator[events_pb2.Envelope]:
    """Decoded envelopes of ``stream``; undecodable records are parked and skipped.

    Each agent dead-letters on its own account (``consumer`` names it), as every
    consumer of the log does.
    """
    async for event in stream.events():
        try:
            yield decode(event.value)
        except DecodeError as exc:
            await _dead_letter(event, reason=str(exc), consumer=f"{APP_ID}.{consumer}")


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
