"""The committed range of every benchmark figure: ``make bench`` fails outside it.

Each benchmark returns its figures, named ``bench.what`` (``core.median_us``);
tests/perf/ranges.yaml holds a range for each, with why it is what it is. A range
guards against regressions and broken measurements (a figure of 0 measured nothing):
ratios against a baseline of the same run hold across machines, absolute times are
bounded loosely because the machines are shared and noisy. The targets of DESIGN.md
are printed by each benchmark beside its tables, met or not.

Ranges hold for the default parameters: a run with other flags prints its figures
against them but is not judged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from libs.config.document import FileModel, load
from tests.perf.stats import console, fmt, table

RANGES_FILE = Path(__file__).with_name("ranges.yaml")


@dataclass(frozen=True)
class Figure:
    name: str  # "<bench>.<what>", as ranges.yaml names it
    value: float
    unit: str


class Range(FileModel):
    min: float | None = None
    max: float | None = None
    why: str = Field(min_length=1)

    @model_validator(mode="after")
    def _bounded(self) -> Range:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self

    def holds(self, value: float) -> bool:
        # NaN fails every comparison: a figure that could not be measured is out of range.
        low = -math.inf if self.min is None else self.min
        high = math.inf if self.max is None else self.max
        return low <= value <= high

    def __str__(self) -> str:
        if self.min is None:
            return f"<= {fmt(self.max or 0.0)}"
        if self.max is None:
            return f">= {fmt(self.min)}"
        return f"{fmt(self.min)} .. {fmt(self.max)}"


class RangesFile(FileModel):
    ranges: dict[str, Range]


@dataclass(frozen=True)
class Verdict:
    name: str
    value: str
    expected: str
    ok: bool


def load_ranges(path: Path = RANGES_FILE) -> dict[str, Range]:
    return load(RangesFile, path).ranges


def judge(figures: Iterable[Figure], ranges: Mapping[str, Range], ran: set[str]) -> list[Verdict]:
    """A verdict per figure, and one per range of a benchmark that ran but did not
    measure it (a figure that silently disappeared is a failure too)."""
    verdicts, seen = [], set()
    for figure in figures:
        seen.add(figure.name)
        shown = f"{fmt(figure.value)} {figure.unit}".strip()
        found = ranges.get(figure.name)
        if found is None:
            verdicts.append(Verdict(figure.name, shown, "no committed range", False))
        else:
            verdicts.append(Verdict(figure.name, shown, str(found), found.holds(figure.value)))
    for name, expected in ranges.items():
        if name.split(".", 1)[0] in ran and name not in seen:
            verdicts.append(Verdict(name, "not measured", str(expected), False))
    return verdicts


def report(verdicts: list[Verdict], *, judged: bool) -> bool:
    """Print the verdicts; whether every one held (always, when not ``judged``)."""
    rows = [
        [v.name, v.value, v.expected, ("PASS" if v.ok else "FAIL") if judged else "-"]
        for v in verdicts
    ]
    title = "figures against tests/perf/ranges.yaml"
    if not judged:
        title += " (not judged: ranges hold for the default parameters)"
    table(title, ["figure", "value", "range", "verdict"], rows)
    failed = [v.name for v in verdicts if not v.ok]
    if judged and failed:
        console.print(f"FAIL: {len(failed)} figure(s) outside their range: {', '.join(failed)}")
    return not judged or not failed
