"""The serving pool's busy meter (a time-weighted mean over a window, kept replayable)
and the staffing it feeds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from libs.core.compass.busy import MARK_MS, BusyMeter
from libs.core.compass.pool import staffed
from libs.core.state import State


def meter(window_ms: float = 30_000) -> tuple[BusyMeter, State]:
    state = State()
    return BusyMeter(state, window_ms), state


def test_a_count_held_for_a_window_is_the_mean() -> None:
    busy, _ = meter()
    busy.count(1000, 3)
    assert busy.mean(31_000) == 3
    assert busy.mean(90_000) == 3


def test_a_meter_younger_than_its_window_averages_over_its_life() -> None:
    busy, _ = meter()
    busy.count(60_000, 3)
    assert busy.mean(60_500) == 3  # younger than a mark: the count itself
    busy.count(70_000, 1)
    assert busy.mean(75_000) == (3 * 10 + 1 * 5) / 15


def test_the_mean_weighs_each_count_by_how_long_it_held() -> None:
    busy, _ = meter()
    busy.count(0, 4)
    busy.count(10_000, 0)
    busy.count(40_000, 2)
    assert busy.mean(50_000) == (4 * 0 + 0 * 20 + 2 * 10) / 30
    busy.count(41_000, 0)
    assert busy.mean(55_000) == 2 / 30


def test_what_left_the_window_no_longer_counts_however_long_it_held() -> None:
    busy, _ = meter()
    busy.count(0, 4)
    busy.count(100_000, 1)
    assert busy.mean(105_000) == (4 * 25 + 1 * 5) / 30
    assert busy.mean(150_000) == 1


def test_an_unchanged_count_writes_nothing() -> None:
    busy, state = meter()
    busy.count(1000, 2)
    before = state.digest()
    busy.count(5000, 2)
    assert state.digest() == before
    assert busy.mean(31_000) == 2


def test_the_clock_never_goes_back() -> None:
    busy, _ = meter()
    busy.count(5000, 2)
    busy.count(4000, 0)  # an earlier time counts as the last change's
    assert busy.mean(35_000) == 0
    assert busy.mean(3000) == busy.mean(5000)  # and so does an earlier read


changes = st.lists(st.tuples(st.floats(0, 5000, allow_nan=False), st.integers(0, 64)), max_size=60)


@given(changes=changes, later=st.floats(0, 60_000, allow_nan=False))
def test_the_mean_is_between_the_counts_of_its_window_and_the_marks_stay_few(
    changes: list[tuple[float, int]], later: float
) -> None:
    window_ms = 10_000
    busy, state = meter(window_ms)
    now, held = 0.0, [(0.0, 0)]  # (from, count)
    for gap, count in changes:
        now += gap
        busy.count(now, count)
        if count != held[-1][1]:
            held.append((now, count))
        assert len(busy._marks) <= window_ms / MARK_MS + 2
    now += later
    # The window may start up to a mark early: the counts in effect over that span.
    seen = [c for at, c in held if at > now - window_ms - MARK_MS]
    seen += [c for at, c in held if at <= now - window_ms - MARK_MS][-1:]
    # The mean is a quotient of sums: it may be off by a rounding (53 over a span of
    # 4,946.97... ms came out 53.00000000000001), never by a count.
    assert min(seen) - 1e-9 <= busy.mean(now) <= max(seen) + 1e-9
    assert state.digest() == state.recomputed()


def test_a_window_of_nine_busy_gpus_is_staffed_as_nine_not_as_a_hair_more() -> None:
    busy, _ = meter()
    busy.count(3846.6, 9)
    # A backlog starts and is gone in the same millisecond: nine held all window.
    busy.count(21_496.8, 12)
    busy.count(21_496.8, 9)
    load = busy.mean(37_540.9)
    assert load != 9 and abs(load - 9) < 1e-12  # the float error the staffing absorbs
    assert staffed(load, 2.0) == staffed(9, 2.0) == 15  # 9 + 2 × 3


@given(st.integers(0, 1000), st.integers(0, 4), st.floats(-4e-16, 4e-16))
def test_a_square_load_off_by_a_few_ulps_is_staffed_as_the_square(
    root: int, reserve: int, error: float
) -> None:
    load = root * root * (1 + error)  # a mean a few roundings off a whole square
    assert staffed(load, reserve) == root * root + reserve * root


@given(st.floats(0, 1e6), st.floats(0, 4), st.floats(1e-3, 10))
def test_more_load_never_calls_for_fewer_gpus(load: float, reserve: float, more: float) -> None:
    # Never fewer GPUs than the load (but a nanoGPU's worth, which rounds away).
    assert load - 1e-9 <= staffed(load, reserve) <= staffed(load + more, reserve)
