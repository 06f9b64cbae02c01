"""Envelopes: the one wire shape of every event Quartermaster records."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from google.protobuf.message import DecodeError as _ProtoDecodeError
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import events_pb2

from libs.core.limits import MAX_TEXT_CHARS
from libs.events.wire_time import NANOS, TIMESTAMP_SECONDS

DEFAULT_CLUSTER = "default"


class DecodeError(ValueError):
    """A record is not a usable envelope; the message says why."""


def new_envelope(
    payload: Message,
    *,
    producer: str,
    cluster: str = DEFAULT_CLUSTER,
    correlation_id: str = "",
    causation_id: str = "",
    occurred: datetime | Timestamp | None = None,
    event_id: str | None = None,
) -> events_pb2.Envelope:
    """Wrap a payload message in an envelope with a fresh id and timestamp.

    ``occurred`` may be a ``Timestamp`` already: a writer of many envelopes of one
    time converts it once.

    The payload's message name picks the oneof field, so a payload type the
    envelope does not know is a programming error raised here, not on the wire.
    """
    env = events_pb2.Envelope(
        event_id=event_id or uuid.uuid4().hex,
        producer=producer,
        cluster=cluster or DEFAULT_CLUSTER,
        correlation_id=correlation_id,
        causation_id=causation_id,
    )
    if isinstance(occurred, Timestamp):
        env.occurred_at.CopyFrom(occurred)
    else:
        env.occurred_at.FromDatetime(occurred or datetime.now(UTC))
    descriptor = payload.DESCRIPTOR
    field = _FIELD_BY_MESSAGE.get(descriptor.full_name) if descriptor else None
    if field is None:
        raise TypeError(f"{type(payload).__name__} is not an envelope payload")
    getattr(env, field).CopyFrom(payload)
    return env


def event_type(env: events_pb2.Envelope) -> str:
    """The payload's field name, e.g. ``job_submitted``; empty when unset."""
    return env.WhichOneof("payload") or ""


def occurred_at(env: events_pb2.Envelope) -> float:
    """Event time in seconds since the epoch."""
    return timestamp_seconds(env.occurred_at)


def timestamp_seconds(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def encode(env: events_pb2.Envelope) -> bytes:
    """The record of ``env``: deterministic, so that replaying a decision yields the same
    bytes. A signed envelope's signature goes last, after the body it signs
    (``libs/trust/keys.py``), so a sealed record decoded and encoded again is the same."""
    signature = env.signature
    if not signature:
        return env.SerializeToString(deterministic=True)
    env.ClearField("signature")
    body = env.SerializeToString(deterministic=True)
    env.signature = signature
    return body + signature_field(signature)


# The envelope's ``signature`` field (8, length-delimited) as a record ends with it.
SIGNATURE_TAG = 8 << 3 | 2


def signature_field(signature: bytes) -> bytes:
    """The ``signature`` field's bytes, as appended after a record's body."""
    return bytes([SIGNATURE_TAG, len(signature)]) + signature


def decode(data: bytes | None) -> events_pb2.Envelope:
    """Parse and sanity-check one record value."""
    if not data:
        raise DecodeError("empty record value")
    env = events_pb2.Envelope()
    try:
        env.ParseFromString(data)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not a qm.v1.Envelope: {exc}") from exc
    if not env.event_id:
        raise DecodeError("envelope has no event_id")
    if not event_type(env):
        raise DecodeError("envelope has no payload (unknown event type?)")
    at = env.occurred_at
    first, last = TIMESTAMP_SECONDS
    if not (first <= at.seconds <= last and 0 <= at.nanos < NANOS):
        # Every reader turns it into a datetime (placement stamps its decisions with it).
        raise DecodeError("envelope occurred_at is not a time from year 1 to 9999")
    # A record no longer than the limit cannot hold a longer field (a character is at
    # least a byte): most inputs (ticks, task events) skip the look at each.
    if len(data) > MAX_TEXT_CHARS:
        for name in _HEADER_FIELDS:
            if len(getattr(env, name)) > MAX_TEXT_CHARS:
                raise DecodeError(f"envelope {name} is longer than {MAX_TEXT_CHARS} characters")
    return env


# Ids every consumer keys state by (the cluster picks a scheduler): bounded, so that
# a hostile record cannot make them grow without limit.
_HEADER_FIELDS = ("event_id", "producer", "correlation_id", "causation_id", "cluster")


_FIELD_BY_MESSAGE = {
    field.message_type.full_name: field.name
    for field in events_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields
    if field.message_type is not None
}
