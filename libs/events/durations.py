"""Seconds (the core's plain floats) to ``google.protobuf.Duration`` and back, exactly.

Decoding divides the whole nanoseconds once (correctly rounded); encoding takes the
float's exact decimal value, so ``duration(seconds(d)) == d`` for every Duration a
float can tell apart, and the log's bytes survive a replay.
"""

from __future__ import annotations

from decimal import Decimal

from google.protobuf.duration_pb2 import Duration

NANOS = 10**9


def seconds(d: Duration) -> float:
    return (d.seconds * NANOS + d.nanos) / NANOS


def whole_seconds(d: Duration) -> int:
    """Rounded up: a contract of 1.5 s protects the job for 2."""
    return -(-(d.seconds * NANOS + d.nanos) // NANOS)


def duration(s: float) -> Duration:
    """``s`` seconds, to the nearest nanosecond; ValueError if it is not finite."""
    if not Decimal(s).is_finite():
        raise ValueError(f"a duration must be finite, got {s}")
    d = Duration()
    d.FromNanoseconds(round(Decimal(s) * NANOS))
    return d
