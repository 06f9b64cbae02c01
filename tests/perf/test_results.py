"""``bench/results.json``: every figure under its dotted name and nested, with its check."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.perf.ranges import Figure, Range, judge
from tests.perf.results import write_results


def test_figures_are_written_by_dotted_name_and_nested_with_their_checks(tmp_path: Path) -> None:
    figures = [
        Figure("live.p99_ms", 120.0, "ms"),
        Figure("core.scaling.100.median_us", 40.0, "µs"),
        Figure("core.scaling.1000.median_us", math.nan, "µs"),
    ]
    ranges = {"live.p99_ms": Range(max=100.0, why="target")}
    path = tmp_path / "bench" / "results.json"
    write_results(figures, judge(figures[:1], ranges, ran={"live"}), judged=True, path=path)
    document = json.loads(path.read_text())
    assert document["live"]["p99_ms"] == document["live.p99_ms"] == 120.0
    assert document["core.scaling"] == {"100": {"median_us": 40.0}, "1000": {"median_us": None}}
    assert document["core"]["scaling"]["100"]["median_us"] == 40.0
    assert document["checks"]["live.p99_ms"] == {"value": "120 ms", "range": "<= 100", "ok": False}
    assert document["ok"] is False and document["units"]["live.p99_ms"] == "ms"
