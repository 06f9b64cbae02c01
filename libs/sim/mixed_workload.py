"""What a mixed cluster is offered (``libs.sim.mixed``): the cluster, the budget tree of two
batch teams and a serving team, batch jobs by a Poisson process offering ``batch_load`` ×
the cluster's GPU time (sizes 1-8 GPUs, log-uniform runtimes, debug, allocated or free
contracts; the serving team submits a share of them too), and the four Compass workflows
for the serving team, ``burst_factor`` × faster during the burst.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from libs.core.budget_tree import BudgetNode, BudgetTree
from libs.core.compass import Workflow
from libs.core.model import JobSpec
from libs.sim.cluster import ClusterSpec
from libs.sim.workload import SimJob

SERVING_TEAM = "serving"
TEAMS = (("vision", 40.0), ("language", 35.0), (SERVING_TEAM, 25.0))  # name, weight
SIZES = ((1, 0.35), (2, 0.2), (4, 0.25), (8, 0.2))  # batch GPUs, weight
RUNTIME_S = (120.0, 3600.0)  # batch runtimes: log-uniform between these
DEBUG_MIN_RUNTIME_S = 600  # small short jobs: the debug class
ALLOCATED_MIN_RUNTIME_S = 1800


@dataclass(frozen=True)
class MixedSettings:
    cluster: ClusterSpec = field(default_factory=lambda: ClusterSpec(16, 8, "H100", 80.0))
    teams: tuple[tuple[str, float], ...] = TEAMS
    hours: float = 2.0  # the measured window: workflows arrive during it
    warmup_s: float = 1800.0  # batch work alone before it, so serving meets a full cluster
    batch_load: float = 2.0  # batch GPU time offered ÷ the cluster's
    batch_runtime_s: tuple[float, float] = RUNTIME_S  # log-uniform between these
    serving_batch_share: float = 0.1  # of the batch jobs, submitted by the serving team
    free_share: float = 0.25  # of the batch jobs, free work (minimum runtime 0)
    workflow_rate_per_s: float = 2.0  # outside the burst
    burst_factor: float = 4.0
    burst_s: tuple[float, float] = (2400.0, 4800.0)  # into the window
    tick_s: float = 30.0
    snapshot_s: float = 300.0
    stop_grace_s: float = 30.0
    sample_s: float = 10.0  # time-series resolution, for the plot
    seed: int = 7

    @property
    def window_s(self) -> float:
        return self.hours * 3600

    @property
    def end_s(self) -> float:
        return self.warmup_s + self.window_s

    def phase(self, at_s: float) -> str:
        """calm or burst, for a time in seconds since the window opened."""
        return "burst" if self.burst_s[0] <= at_s < self.burst_s[1] else "calm"


def budget_tree(teams: Sequence[tuple[str, float]] = TEAMS) -> BudgetTree:
    return BudgetTree((BudgetNode("cluster"), *(BudgetNode(n, "cluster", w) for n, w in teams)))


def batch_jobs(settings: MixedSettings, rng: random.Random) -> list[SimJob]:
    """Poisson arrivals over [0, end) offering ``batch_load`` × the cluster's GPU time."""
    lo, hi = settings.batch_runtime_s
    mean_runtime = (hi - lo) / math.log(hi / lo)
    sizes = [size for size, _ in SIZES]
    weights = [weight for _, weight in SIZES]
    mean_gpus = sum(s * w for s, w in SIZES) / sum(weights)
    capacity = settings.cluster.nodes * settings.cluster.gpus_per_node
    rate = settings.batch_load * capacity / (mean_gpus * mean_runtime)
    teams = [n for n, _ in settings.teams if n != SERVING_TEAM]
    jobs: list[SimJob] = []
    at = rng.expovariate(rate)
    while at < settings.end_s:
        if rng.random() < settings.serving_batch_share:
            team = SERVING_TEAM
        else:
            team = teams[rng.randrange(len(teams))]
        gpus = rng.choices(sizes, weights)[0]
        runtime = lo * (hi / lo) ** rng.random()
        resumable = False
        if rng.random() < settings.free_share:
            min_runtime = 0
            resumable = rng.random() < 0.5
        elif gpus <= 2 and runtime <= 900:
            min_runtime = DEBUG_MIN_RUNTIME_S
        else:
            min_runtime = ALLOCATED_MIN_RUNTIME_S
        spec = JobSpec(team, "sim", gpus, (), min_runtime_s=min_runtime, resumable=resumable)
        jobs.append(SimJob(at, f"b{len(jobs):05d}", spec, runtime))
        at += rng.expovariate(rate)
    return jobs


def workflow_arrivals(
    settings: MixedSettings, flows: Sequence[Workflow], rng: random.Random
) -> list[tuple[float, Workflow]]:
    """(seconds into the window, workflow): Poisson, ``burst_factor`` × faster in the burst."""
    out: list[tuple[float, Workflow]] = []
    edges = sorted({*settings.burst_s, settings.window_s})
    at = 0.0
    while at < settings.window_s:
        rate = settings.workflow_rate_per_s
        if settings.phase(at) == "burst":
            rate *= settings.burst_factor
        following = at + rng.expovariate(rate)
        edge = next((e for e in edges if e > at), settings.window_s)
        if following >= edge:  # memoryless: start over at the phase change
            at = edge
            continue
        at = following
        out.append((at, flows[rng.randrange(len(flows))]))
    return out
