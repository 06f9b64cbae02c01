"""The one duration parser: what people write, and what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.config.duration import UNITS, format_duration, parse_duration, parse_moment


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("1d", 86_400),
        ("1h30m", 5400),
        ("1d2h3m4s", 93_784),
        ("90", 90),
        ("2.5", 2.5),
        ("1.5h", 5400),
        (" 2H ", 7200),
        ("0", 0),
        ("10ms", 0.01),
        ("1s500ms", 1.5),
    ],
)
def test_what_people_write(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "h", "1x", "-5m", "1m1h", "1h1h", "5 m", "1e3", "inf", "nan", "1h 30m", "5ms1s"],
)
def test_anything_else_is_refused_saying_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration like 90s, 15m, 2h, 1d, 1h30m, 10ms"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["9" * 400, "9" * 400 + "d"])
def test_a_number_past_any_float_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="too long a duration"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_a_written_duration_reads_back_as_the_same_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=4, max_size=4))
def test_parts_add_up(counts: list[int]) -> None:
    text = "".join(f"{count}{unit}" for count, unit in zip(counts, UNITS, strict=True))
    expected = sum(count * size for count, size in zip(counts, UNITS.values(), strict=True))
    assert parse_duration(text) == expected


def test_written_largest_units_first() -> None:
    assert [format_duration(s) for s in (0, 59, 5400, 86_401)] == ["0s", "59s", "1h30m", "1d1s"]


NOW = 1_796_000_000.0


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2h", NOW - 7200),
        ("0", NOW),
        ("2026-12-04T06:00:00Z", 1_796_364_000.0),
        ("2026-12-04T06:00:00", 1_796_364_000.0),  # no zone: UTC
        ("2026-12-04T07:00:00+01:00", 1_796_364_000.0),
        ("2026-12-04", 1_796_342_400.0),
    ],
)
def test_a_moment_is_a_duration_ago_or_a_timestamp(text: str, moment: float) -> None:
    assert parse_moment(text, NOW) == moment


def test_a_moment_that_is_neither_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"neither a duration ago .* nor a timestamp like"):
        parse_moment("yesterday", NOW)
