"""The protobuf event envelope: building, typing, encoding and decoding it."""

from libs.events.envelope import (
    DecodeError,
    decode,
    encode,
    event_type,
    new_envelope,
    occurred_at,
)

__all__ = ["DecodeError", "decode", "encode", "event_type", "new_envelope", "occurred_at"]
