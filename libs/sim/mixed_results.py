"""What a mixed-cluster run measured (``libs.sim.mixed``): GPUs held, slowdowns, charges
and samples over the window, per phase, and one seed's runs side by side."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.core.compass import CacheModel
from libs.sim.recorder import Distribution

PHASES = ("all", "calm", "burst")


@dataclass(frozen=True)
class Held:
    """GPUs held, weighted by time."""

    median: float
    p90: float
    max: float
    mean: float


@dataclass(frozen=True)
class Slowdowns:
    """Workflow latency ÷ its best case, for the workflows that arrived in a phase."""

    count: int
    median: float
    p99: float
    median_latency_ms: float
    waited: int  # workflows that had to wait for a GPU (no serving GPU could take them)


@dataclass(frozen=True)
class Charge:
    """GPU-hours charged in the window (as the projector would), against the budget."""

    allocation: str
    entitlement: float  # share of the cluster
    allocated_gpu_h: float  # charged: what fair share counts
    free_gpu_h: float  # free work, not charged
    serving_held_gpu_h: float  # of the allocated: GPUs serving held for it, busy or idle
    serving_gpu_h: float  # of those: workflow tasks running


@dataclass(frozen=True)
class Sample:
    at_s: float  # into the window
    serving_held: int  # GPUs the serving core holds from batch work
    serving_active: int  # GPUs with a serving task running or queued
    batch: tuple[int, ...]  # GPUs held by batch work, by class (debug, allocated, unallocated)


@dataclass(frozen=True)
class MixedRun:
    serving_max_fraction: float
    serving_linger_s: float
    serving_lend_s: float
    serving_reserve: float
    serving_reserve_min: int
    serving_load_window_s: float
    capacity: int
    serving_cap: int  # GPUs
    window_s: float
    burst_s: tuple[float, float]
    serving_held: dict[str, Held]  # by phase
    at_cap_pct: float  # of the window with serving at its cap
    serving_busy: dict[str, float]  # mean GPUs running workflow tasks, by phase
    batch_held: dict[str, Held]
    # Free GPUs by phase: on nodes kept for a waiting job (being freed or earmarked for it),
    # and the others (free because no job waiting fits them).
    free_kept: dict[str, Held]
    free_other: dict[str, Held]
    batch_occupancy_pct: float
    cluster_occupancy_pct: float  # batch + serving held
    busy_occupancy_pct: float  # batch held + serving running
    batch_waits: dict[tuple[str, str], Distribution]  # (allocation or all, class or all) -> s
    workflows: dict[str, Slowdowns]  # by phase
    charges: tuple[Charge, ...]
    cache_hit_rate: float
    batch_evictions: int  # models evicted because a batch task took their GPU
    preemptions: int
    jobs: int  # batch jobs submitted in the window
    workflow_jobs: int
    # The pool backed up with no job it may stop (it grows only onto GPUs batch work
    # frees), within the window: seconds in all, and the longest such spell.
    stalled_s: float
    longest_stall_s: float
    peak_serving_held: int  # the most GPUs serving held at any input, window or not
    peak_serving_active: int  # the most GPUs with serving work, sampled
    gpu_s_run: dict[str, float]  # whole run, per allocation: what the batch tasks used
    gpu_s_held: float  # whole run: the GPUs serving held (charged to the serving team)
    gpu_s_charged: dict[str, float]  # whole run, per allocation: WindowedUsage at the end
    decisions: int
    inputs: int
    series: tuple[Sample, ...] = field(repr=False)
    cache_model: CacheModel = CacheModel.LOOKAHEAD  # the workers', as the planner knew it
    wall_s: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class SeedRuns:
    """One seed's runs: one per ``serving_max_fraction``, and its batch jobs alone."""

    seed: int
    runs: tuple[MixedRun, ...]
    alone: MixedRun
