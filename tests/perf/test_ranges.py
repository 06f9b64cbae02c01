"""The benchmark ranges: the committed file is valid, and a figure outside fails."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from libs.config.document import ConfigError
from tests.perf.bench import BENCHES, parse_args
from tests.perf.ranges import Figure, Range, judge, load_ranges, report

RANGES = {
    "core.median_us": Range(min=1.0, max=1000.0, why="target"),
    "workflow.wide.arrival_ms": Range(max=2000.0, why="regression guard"),
}


def test_the_committed_ranges_load_and_name_only_benchmarks_that_exist() -> None:
    ranges = load_ranges()
    assert ranges
    assert {name.split(".", 1)[0] for name in ranges} <= set(BENCHES)


def test_figures_inside_their_ranges_pass() -> None:
    figures = [Figure("core.median_us", 400.0, "µs")]
    [verdict] = judge(figures, RANGES, ran={"core"})
    assert verdict.ok and verdict.expected == "1 .. 1,000"


@pytest.mark.parametrize("value", [0.5, 1500.0, math.nan])
def test_a_figure_outside_its_range_or_unmeasurable_fails(value: float) -> None:
    [verdict] = judge([Figure("core.median_us", value, "µs")], RANGES, ran={"core"})
    assert not verdict.ok
    assert report([verdict], judged=True) is False


def test_a_figure_without_a_range_and_a_range_without_its_figure_fail() -> None:
    verdicts = judge([Figure("workflow.chain.arrival_ms", 5.0, "ms")], RANGES, ran={"workflow"})
    by_name = {v.name: v for v in verdicts}
    assert by_name["workflow.chain.arrival_ms"].expected == "no committed range"
    assert by_name["workflow.wide.arrival_ms"].value == "not measured"
    assert not any(v.ok for v in verdicts)
    # Only the benchmarks that ran are owed their figures.
    assert [v.name for v in judge([], RANGES, ran={"live"})] == []


def test_a_run_with_other_parameters_is_shown_but_not_judged() -> None:
    [verdict] = judge([Figure("core.median_us", 5000.0, "µs")], RANGES, ran={"core"})
    assert report([verdict], judged=False) is True
    assert parse_args(["core"]) == parse_args(["core"])
    assert parse_args(["core", "--waiting", "10"]) != parse_args(["core"])


def test_a_range_without_bounds_or_reason_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "ranges.yaml"
    bad.write_text("ranges:\n  core.median_us: {why: no bounds}\n")
    with pytest.raises(ConfigError, match="give min, max or both"):
        load_ranges(bad)
    bad.write_text("ranges:\n  core.median_us: {min: 3, max: 1}\n")
    with pytest.raises(ConfigError, match="why"):
        load_ranges(bad)
