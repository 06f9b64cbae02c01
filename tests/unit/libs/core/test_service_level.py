"""The headline over many allocations: a floor for the worst team, the small teams apart,
and a weighted figure over everyone (libs/core/service_level.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.core.service_level import SMALL_TEAM_OWED_FRACTION, SmallTeams, headline

CAPACITY = 1_000_000.0  # GPU-seconds: the floor is 1,000


def test_the_worst_team_is_taken_over_the_teams_at_the_floor_or_above() -> None:
    h = headline([(1_000.0, 900.0), (50_000.0, 49_000.0), (999.0, 0.0), (0.0, 5.0)], CAPACITY)
    assert h.min_pct == pytest.approx(90.0)
    assert h.small_teams == SmallTeams(
        count=1, owed_pct=pytest.approx(100 * 999 / 51_999), min_pct=0.0
    )
    assert h.weighted_pct == pytest.approx(100 * (900 + 49_000) / 51_999)


def test_more_than_owed_counts_as_owed_in_the_weighted_figure() -> None:
    h = headline([(2_000.0, 4_000.0), (2_000.0, 1_000.0)], CAPACITY)
    assert (h.min_pct, h.weighted_pct) == (pytest.approx(50.0), pytest.approx(75.0))


def test_nothing_owed_gives_no_figures() -> None:
    assert headline([(0.0, 3.0)], CAPACITY) == headline([], CAPACITY)
    assert headline([], CAPACITY).min_pct is None and headline([], CAPACITY).weighted_pct is None
    assert headline([], CAPACITY).small_teams == SmallTeams()


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)), max_size=20))
def test_no_team_owed_anything_is_dropped_silently(levels: list[tuple[float, float]]) -> None:
    h = headline(levels, CAPACITY)
    floor = SMALL_TEAM_OWED_FRACTION * CAPACITY
    owed = [(o, d) for o, d in levels if o > 0]
    big = [o for o, _ in owed if o >= floor]
    assert h.small_teams.count + len(big) == len(owed)
    assert (h.min_pct is None) == (not big)
    if h.weighted_pct is not None:
        assert 0.0 <= h.weighted_pct <= 100.0 + 1e-9
