"""The sweep's tables, one set for every reader: ``qm sim workflows`` prints them (and
writes them under -o json|yaml), ``markdown`` writes them with the claims to sweep.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.core.compass import (
    PlanMode,
)
from libs.sim.workflows.claims import claims, over_seeds, settings
from libs.sim.workflows.sweep_runner import SweepRun


@dataclass(frozen=True)
class Spread:
    """One setting (arrival process, size, mode) over several seeds."""

    arrivals: str
    gpus: int
    mode: PlanMode
    medians: tuple[float, ...]  # each seed's median slowdown
    p99s: tuple[float, ...]

    def cells(self) -> list[str]:
        """GPUs, mode, then the median over the seeds (their range) of each figure."""
        return [str(self.gpus), self.mode.value, _spread(self.medians), _spread(self.p99s)]


SPREAD_HEADER = ["GPUs", "mode", "median (seeds' range)", "p99 (seeds' range)"]


def spreads(runs: Sequence[SweepRun]) -> list[Spread]:
    """Each setting's figures over the seeds, in the order first seen."""
    return [
        Spread(
            *key,
            tuple(r.run.median_slowdown for r in group),
            tuple(r.run.p99_slowdown for r in group),
        )
        for key, group in settings(runs).items()
    ]


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


# A table as every reader gets it: its title, its header, its rows of cells.
Table = tuple[str, list[str], list[list[str]]]

RUN_HEADER = [
    "GPUs", "mode", "seed", "median", "p99", "median latency ms", "p99 latency ms", "hits",
    "used", "held ms", "queue ms", "load ms", "transfer ms", "run ms", "adjusted", "refused",
    "s",
]  # fmt: skip
TASK_HEADER = ["GPUs", "mode", "seed", "task", "queue", "load", "transfer", "run"]


def tables(runs: Sequence[SweepRun], *, per_task: bool = True) -> list[Table]:
    """Per arrival process: each run's slowdown and its mean wait by part (held per
    workflow, the rest per task, in ms), each workflow's median slowdown and cache hits,
    with ``per_task`` each task's parts, and over several seeds each setting's spread."""
    flows = list(dict.fromkeys(f for r in runs for f in r.run.per_workflow))  # as first seen
    seeds = list(dict.fromkeys(r.seed for r in runs))
    shown: list[Table] = []
    for name in dict.fromkeys(r.arrivals for r in runs):
        mine = [r for r in runs if r.arrivals == name]
        about = f"{_arrivals(mine[0])}, {_setting(mine[0])}"
        shown.append((f"{about}: slowdown; held per workflow, the rest per task (mean ms)",
                      RUN_HEADER, [_run_cells(r) for r in mine]))  # fmt: skip
        shown.append(
            (
                f"{about}: median slowdown / cache hits per workflow",
                ["GPUs", "mode", "seed", *flows],
                [
                    [*_setting_cells(r), *(_flow_cell(r.run.per_workflow[f]) for f in flows)]
                    for r in mine
                ],
            )
        )
        if per_task:
            shown.append(
                (
                    f"{about}: per task, mean ms",
                    TASK_HEADER,
                    [
                        [*_setting_cells(r), f"{flow}/{task}", *_parts(parts)]
                        for r in mine
                        for (flow, task), parts in r.run.task_breakdown_ms.items()
                    ],
                )
            )
        if len(seeds) > 1:
            shown.append(
                (
                    f"{about}: slowdown over the seeds " + ", ".join(map(str, seeds)),
                    SPREAD_HEADER,
                    [spread.cells() for spread in spreads(mine)],
                )
            )
    return shown


def markdown(runs: Sequence[SweepRun], total_s: float) -> str:
    """The sweep's tables (``tables``) and the claims, as Markdown."""
    several = len({r.seed for r in runs}) > 1
    lines = ["# Workflow serving sweep", ""]
    for title, header, rows in tables(runs):
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |"]
        lines += ["|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    lines += ["## Claims" + (" (medians over the seeds)" if several else ""), ""]
    lines += [f"- [{'x' if c.holds else ' '}] {c.text}" for c in claims(over_seeds(runs))]
    lines += ["", f"Sweep runtime: {total_s:.1f} s for {len(runs)} runs.", ""]
    return "\n".join(lines)


def _arrivals(run: SweepRun) -> str:
    return "Poisson arrivals" if not run.shape else f"{run.arrivals} arrivals (shape {run.shape:g})"


def _setting(run: SweepRun) -> str:
    r = run.run
    planners = f", {r.planners} planners" if r.planners > 1 else ""
    return f"{r.cache_model.value} caches, reports {r.staleness_ms:g} ms late{planners}"


def _setting_cells(run: SweepRun) -> list[str]:
    return [str(run.run.gpus), run.run.mode.value, str(run.seed)]


def _run_cells(done: SweepRun) -> list[str]:
    r, b = done.run, done.run.breakdown_ms
    return [
        *_setting_cells(done),
        f"{r.median_slowdown:.3f}",
        f"{r.p99_slowdown:.2f}",
        f"{r.median_latency_ms:.0f}",
        f"{r.p99_latency_ms:.0f}",
        f"{r.cache_hit_rate:.1%}",
        str(r.gpus_used),
        f"{r.held_ms:.1f}",
        *_parts(b),
        str(r.adjusted),
        str(r.refused),
        f"{done.wall_s:.1f}",
    ]


def _parts(parts: Mapping[str, float]) -> list[str]:
    return [
        f"{parts['queue']:.1f}",
        f"{parts['load']:.1f}",
        f"{parts['transfer']:.2f}",
        f"{parts['run']:.1f}",
    ]


def _flow_cell(figures: tuple[float, float]) -> str:
    slowdown, hits = figures
    return f"{slowdown:.3f} / {hits:.0%}"
