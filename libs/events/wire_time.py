"""The core's plain numbers (seconds, milliseconds) to protobuf ``Duration`` and
``Timestamp`` and back, exactly.

Decoding divides the whole nanoseconds once (correctly rounded); encoding takes the
float's exact decimal value, so ``duration(seconds(d)) == d`` for every Duration a
float can tell apart, and the log's bytes survive a replay. A value beyond the type's
range (an estimate past the year 9999) is written as the nearest end of it rather than
stopping the service that writes it; only a NaN is refused.
"""

from __future__ import annotations

import math
from decimal import Decimal

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

NANOS = 10**9
NANOS_PER_MS = 10**6
# A Timestamp's whole seconds: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
# The well-known types' ranges, in nanoseconds: ±10,000 years; 0001-01-01 to 9999-12-31.
_DURATION = (-315_576_000_000 * NANOS, 315_576_000_000 * NANOS)
_TIMESTAMP = (TIMESTAMP_SECONDS[0] * NANOS, (TIMESTAMP_SECONDS[1] + 1) * NANOS - 1)


def seconds(d: Duration) -> float:
    return (d.seconds * NANOS + d.nanos) / NANOS


def milliseconds(d: Duration) -> float:
    return (d.seconds * NANOS + d.nanos) / NANOS_PER_MS


def whole_seconds(d: Duration) -> int:
    """Rounded up: a contract of 1.5 s protects the job for 2."""
    return -(-(d.seconds * NANOS + d.nanos) // NANOS)


def duration(s: float) -> Duration:
    """``s`` seconds, to the nearest nanosecond; ValueError for a NaN."""
    d = Duration()
    d.FromNanoseconds(_nanos(s, NANOS, _DURATION))
    return d


def duration_ms(ms: float) -> Duration:
    """``ms`` milliseconds, to the nearest nanosecond; ValueError for a NaN."""
    d = Duration()
    d.FromNanoseconds(_nanos(ms, NANOS_PER_MS, _DURATION))
    return d


def timestamp_ms(ms: float) -> Timestamp:
    """``ms`` milliseconds since the Unix epoch, to the nearest nanosecond."""
    t = Timestamp()
    t.FromNanoseconds(_nanos(ms, NANOS_PER_MS, _TIMESTAMP))
    return t


def _nanos(amount: float, per_unit: int, within: tuple[int, int]) -> int:
    if math.isnan(amount):
        raise ValueError("a duration or time cannot be NaN")
    low, high = within
    if math.isinf(amount):
        return high if amount > 0 else low
    return min(max(round(Decimal(amount) * per_unit), low), high)
