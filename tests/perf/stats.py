"""Percentiles and the rich tables every benchmark prints."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=160)


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's percentile (q in 0..100; linear between the closest ranks, as the
    simulator's reports); NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    """(p50, p90, p99)."""
    return percentile(values, 50), percentile(values, 90), percentile(values, 99)


def fmt(value: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def fmt_us(us: float) -> str:
    """A duration given in µs, in the unit that reads best."""
    if math.isnan(us):
        return "-"
    if us < 1000:
        return f"{us:.3g} µs"
    if us < 1_000_000:
        return f"{us / 1e3:.3g} ms"
    return f"{us / 1e6:.3g} s"


def ratio(value: float, base: float) -> str:
    if math.isnan(value) or math.isnan(base) or base <= 0:
        return "-"
    r = value / base
    return f"{r:.2f}×" if r < 10 else f"{r:,.0f}×"


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    out = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        out.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        out.add_row(*row)
    console.print(out)
