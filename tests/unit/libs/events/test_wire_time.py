"""Seconds and milliseconds to Duration and Timestamp and back: exact where a replay needs
it, never stopping a writer on an estimate out of range."""

from __future__ import annotations

import math

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given
from hypothesis import strategies as st

from libs.events.wire_time import (
    duration,
    duration_ms,
    milliseconds,
    seconds,
    timestamp_ms,
    whole_seconds,
)

# Below 2^52 ns (52 days) a float of seconds or milliseconds tells every nanosecond apart.
EXACT_NANOS = st.integers(min_value=-(2**52), max_value=2**52)


def from_nanos(nanos: int) -> Duration:
    d = Duration()
    d.FromNanoseconds(nanos)
    return d


@given(EXACT_NANOS)
def test_a_recorded_duration_is_written_back_the_same(nanos: int) -> None:
    d = from_nanos(nanos)
    assert duration(seconds(d)) == d
    assert duration_ms(milliseconds(d)) == d


@pytest.mark.parametrize("value", [0.1, 0.5, 600.0, 5400.25, 562.4, 86_400_000.000001])
def test_a_short_decimal_survives_the_trip(value: float) -> None:
    assert seconds(duration(value)) == value
    assert milliseconds(duration_ms(value)) == value
    assert seconds(duration(1e-9)) == 1e-9


def test_a_contract_counts_a_started_second_whole() -> None:
    assert [whole_seconds(from_nanos(n)) for n in (0, 1, 10**9, 10**9 + 1, -1)] == [0, 1, 1, 2, 0]


def test_beyond_the_range_is_its_nearest_end_and_nan_is_refused() -> None:
    assert duration(math.inf) == Duration(seconds=315_576_000_000)
    assert duration_ms(-1e30) == Duration(seconds=-315_576_000_000)
    assert timestamp_ms(1e18).ToJsonString() == "9999-12-31T23:59:59.999999999Z"
    assert timestamp_ms(-math.inf).ToJsonString() == "0001-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="NaN"):
        duration(math.nan)
