"""``bench/results.json``: every figure of a ``make bench`` run, with its range and verdict.

Each figure is there under its dotted name (``"live.p50_ms"``) and nested by the
name's parts (``["live"]["p50_ms"]``), and so is every group of figures
(``"core.scaling"``: a node count -> its figures), so that a reader can take either
path. ``checks`` holds, per figure, the committed range and whether it held.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.perf.ranges import Figure, Verdict

RESULTS_FILE = Path(__file__).resolve().parents[2] / "bench" / "results.json"


def nested(figures: Iterable[Figure]) -> dict[str, Any]:
    """The figures as a tree keyed by their names' parts, plus every dotted path of it."""
    tree: dict[str, Any] = {}
    for figure in figures:
        *groups, leaf = figure.name.split(".")
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        node[leaf] = figure.value
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if prefix:
                flat[path] = value
            if isinstance(value, dict):
                walk(path, value)

    walk("", tree)
    return {**tree, **flat}


def write_results(
    figures: list[Figure], verdicts: list[Verdict], *, judged: bool, path: Path = RESULTS_FILE
) -> None:
    document = {
        **nested(figures),
        "checks": {v.name: {"value": v.value, "range": v.expected, "ok": v.ok} for v in verdicts},
        "ok": all(v.ok for v in verdicts),
        "judged": judged,  # ranges hold for the default parameters only
        "units": {f.name: f.unit for f in figures},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # NaN (a figure that could not be measured) is written as null: JSON has no NaN.
    path.write_text(json.dumps(_finite(document), indent=2, sort_keys=True) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
