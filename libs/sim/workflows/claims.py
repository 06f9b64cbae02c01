"""What a sweep shows of the Compass paper's claims, per arrival process, over the
seeds (each setting's median).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from libs.core.compass import (
    PlanMode,
)
from libs.sim.workflows.sweep_runner import SweepRun


def over_seeds(runs: Sequence[SweepRun]) -> list[SweepRun]:
    """One run per setting: the first seed's, with each slowdown figure the median over
    the seeds (what a claim about a sweep of several seeds is about)."""
    return [
        dataclasses.replace(
            group[0],
            run=dataclasses.replace(
                group[0].run,
                median_slowdown=statistics.median(r.run.median_slowdown for r in group),
                p99_slowdown=statistics.median(r.run.p99_slowdown for r in group),
            ),
        )
        for group in settings(runs).values()
    ]


def settings(runs: Sequence[SweepRun]) -> dict[tuple[str, int, PlanMode], list[SweepRun]]:
    groups: dict[tuple[str, int, PlanMode], list[SweepRun]] = {}
    for r in runs:
        groups.setdefault((r.arrivals, r.run.gpus, r.run.mode), []).append(r)
    return groups


@dataclass(frozen=True)
class Claim:
    text: str
    holds: bool


def claims(runs: Sequence[SweepRun]) -> list[Claim]:
    """What the sweep shows of the Compass claims, per arrival process.

    1. compass reaches the median slowdown ``hash`` has on its largest cluster
       with at most half as many GPUs;
    2. compass has a lower median slowdown than ``heft`` and ``jit`` at every size.
    """
    out: list[Claim] = []
    for name in dict.fromkeys(r.arrivals for r in runs):
        mine = [r.run for r in runs if r.arrivals == name]
        by = {(r.mode, r.gpus): r for r in mine}
        sizes = sorted({r.gpus for r in mine})
        hashed = [by[(PlanMode.HASH, g)] for g in sizes if (PlanMode.HASH, g) in by]
        compass = [by[(PlanMode.COMPASS, g)] for g in sizes if (PlanMode.COMPASS, g) in by]
        if hashed and compass:
            target = hashed[-1]
            enough = [r for r in compass if r.median_slowdown <= target.median_slowdown]
            fewest = min((r.gpus for r in enough), default=None)
            out.append(
                Claim(
                    f"{name}: hash reaches median {target.median_slowdown:.2f} with "
                    f"{target.gpus} GPUs; compass "
                    + (
                        f"with {fewest} ({fewest / target.gpus:.0%})"
                        if fewest is not None
                        else "never does"
                    ),
                    fewest is not None and fewest * 2 <= target.gpus,
                )
            )
        for rival in (PlanMode.HEFT, PlanMode.JIT):
            pairs = [
                (by[(PlanMode.COMPASS, g)], by[(rival, g)])
                for g in sizes
                if (PlanMode.COMPASS, g) in by and (rival, g) in by
            ]
            if not pairs:
                continue
            lost = [c.gpus for c, o in pairs if c.median_slowdown >= o.median_slowdown]
            out.append(
                Claim(
                    f"{name}: compass's median below {rival.value}'s at "
                    + ("every size" if not lost else f"all but {', '.join(map(str, lost))} GPUs"),
                    not lost,
                )
            )
    return out
