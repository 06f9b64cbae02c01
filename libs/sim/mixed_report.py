"""How a mixed run is shown: the tables ``qm sim mixed`` prints and summary.md (its plot is
``libs.sim.plots.write_mixed_plot``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from libs.sim.mixed_results import PHASES, Charge, Held, MixedRun, SeedRuns
from libs.sim.mixed_workload import SERVING_TEAM, MixedSettings
from libs.sim.recorder import Distribution
from libs.sim.tables import Columns, Table, markdown_table, table


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def tables(run: MixedRun, alone: MixedRun | None = None) -> dict[str, Table]:
    """Title -> (header, rows): what ``qm sim mixed`` prints and summary.md holds;
    ``alone``: the same batch jobs without workflows, the baseline beside it."""
    held, batch, busy = run.serving_held, run.batch_held, run.serving_busy
    by_phase: Columns[str] = (
        ("phase", lambda p: p),
        ("serving p50", lambda p: f"{held[p].median:g}"),
        ("serving p90", lambda p: f"{held[p].p90:g}"),
        ("serving max", lambda p: f"{held[p].max:g}"),
        ("serving mean", lambda p: f"{held[p].mean:.1f}"),
        ("serving busy", lambda p: f"{busy[p]:.1f}"),
        ("serving use", lambda p: f"{100 * busy[p] / held[p].mean:.0f}%" if held[p].mean else "-"),
        ("batch mean", lambda p: f"{batch[p].mean:.1f}"),
        ("batch occupancy", lambda p: f"{100 * batch[p].mean / run.capacity:.1f}%"),
    )
    kept, other = run.free_kept, run.free_other
    idle: list[tuple[str, Callable[[str], str]]] = [
        ("phase", lambda p: p),
        ("not doing work", lambda p: f"{not_working(run, p):.1f}"),
        ("serving held, no task running", lambda p: f"{held[p].mean - busy[p]:.1f}"),
        ("free, on nodes kept for a waiting job", lambda p: f"{kept[p].mean:.1f}"),
        ("free, elsewhere (no waiting job fits)", lambda p: f"{other[p].mean:.1f}"),
    ]
    if alone is not None:
        idle.append(("batch jobs alone: not doing work", lambda p: f"{not_working(alone, p):.1f}"))
    flows = run.workflows
    slowdowns: Columns[str] = (
        ("phase", lambda p: p),
        ("workflows", lambda p: str(flows[p].count)),
        ("median", lambda p: f"{flows[p].median:.3f}"),
        ("p99", lambda p: f"{flows[p].p99:.2f}"),
        ("median latency ms", lambda p: f"{flows[p].median_latency_ms:.0f}"),
        ("waited for a GPU", lambda p: str(flows[p].waited)),
    )
    waits: Columns[tuple[tuple[str, str], Distribution]] = (
        ("allocation", lambda w: w[0][0]),
        ("class", lambda w: w[0][1]),
        ("jobs", lambda w: str(w[1].count)),
        ("p50", lambda w: _minutes(w[1].p50)),
        ("p90", lambda w: _minutes(w[1].p90)),
    )
    total = sum(c.allocated_gpu_h + c.free_gpu_h for c in run.charges) or 1.0
    window_h = run.window_s / 3600
    charges: Columns[Charge] = (
        ("allocation", lambda c: c.allocation),
        ("entitlement", lambda c: f"{c.entitlement:.0%}"),
        ("entitled GPU-h", lambda c: f"{c.entitlement * run.capacity * window_h:.0f}"),
        ("charged GPU-h", lambda c: f"{c.allocated_gpu_h:.0f}"),
        ("of it serving GPUs held", lambda c: f"{c.serving_held_gpu_h:.1f}"),
        ("workflow tasks ran", lambda c: f"{c.serving_gpu_h:.1f}"),
        ("free GPU-h", lambda c: f"{c.free_gpu_h:.0f}"),
        ("share of use", lambda c: f"{(c.allocated_gpu_h + c.free_gpu_h) / total:.1%}"),
    )
    cap = (
        f"serving cap {run.serving_cap} of {run.capacity}; holds its load (mean busy over "
        f"{run.serving_load_window_s:g} s) + {run.serving_reserve:g}×√load, at least "
        f"{run.serving_reserve_min} idle; the rest lent "
        f"back after {run.serving_lend_s:g} s idle, all after {run.serving_linger_s:g} s"
    )
    return {
        f"GPUs held over time ({cap})": table(by_phase, PHASES),
        "GPUs not doing work, by why (mean GPUs)": table(idle, PHASES),
        "Workflows: slowdown (latency ÷ best case), by arrival phase": table(slowdowns, PHASES),
        "Batch queue wait (minutes), jobs submitted in the window": table(
            waits, run.batch_waits.items()
        ),
        "GPU-hours in the window per allocation vs entitlement": table(charges, run.charges),
        "Cluster": (
            ["measure", "value"],
            [
                ["cluster occupancy (batch + serving held)", f"{run.cluster_occupancy_pct:.1f}%"],
                ["serving at its cap", f"{run.at_cap_pct:.1f}% of the window"],
                [
                    "serving stalled (backed up, no job it may stop)",
                    f"{run.stalled_s:.0f} s in all, the longest {run.longest_stall_s:.0f} s",
                ],
                ["busy (batch held + serving running)", f"{run.busy_occupancy_pct:.1f}%"],
                *(
                    [["busy, batch jobs alone (no workflows)", f"{alone.busy_occupancy_pct:.1f}%"]]
                    if alone is not None
                    else []
                ),
                ["batch occupancy", f"{run.batch_occupancy_pct:.1f}%"],
                ["workflow cache hit rate", f"{run.cache_hit_rate:.1%}"],
                ["models evicted by batch placements", str(run.batch_evictions)],
                ["batch preemptions", str(run.preemptions)],
                ["batch jobs / workflows in the window", f"{run.jobs} / {run.workflow_jobs}"],
                ["decisions / inputs", f"{run.decisions} / {run.inputs}"],
                ["simulation wall-clock", f"{run.wall_s:.1f} s"],
            ],
        ),
    }


def not_working(run: MixedRun, phase: str) -> float:
    """Mean GPUs neither held by batch work nor running a workflow task: serving's idle
    ones and the free ones."""
    return (
        run.serving_held[phase].mean
        - run.serving_busy[phase]
        + run.free_kept[phase].mean
        + run.free_other[phase].mean
    )


def _spread(held: Held) -> str:
    return f"{held.median:g} / {held.p90:g} / {held.max:g}"


def _all_waits(run: MixedRun) -> Distribution:
    return run.batch_waits.get(("all", "all"), Distribution.of([]))


COMPARISON: Columns[MixedRun] = (
    ("serving_max_fraction", lambda r: f"{r.serving_max_fraction:g}"),
    ("cap", lambda r: str(r.serving_cap)),
    ("at cap", lambda r: f"{r.at_cap_pct:.0f}%"),
    ("serving p50/p90/max", lambda r: _spread(r.serving_held["all"])),
    (
        "serving mean (burst)",
        lambda r: f"{r.serving_held['all'].mean:.1f} ({r.serving_held['burst'].mean:.1f})",
    ),
    ("batch occupancy", lambda r: f"{r.batch_occupancy_pct:.1f}%"),
    ("cluster occupancy", lambda r: f"{r.cluster_occupancy_pct:.1f}%"),
    (
        "wf median calm/burst",
        lambda r: f"{r.workflows['calm'].median:.2f} / {r.workflows['burst'].median:.2f}",
    ),
    (
        "wf p99 calm/burst",
        lambda r: f"{r.workflows['calm'].p99:.1f} / {r.workflows['burst'].p99:.1f}",
    ),
    (
        "batch p50/p90 wait min",
        lambda r: f"{_minutes(_all_waits(r).p50)} / {_minutes(_all_waits(r).p90)}",
    ),
    ("wall s", lambda r: f"{r.wall_s:.1f}"),
)


SEEDS_TITLE = "Over the seeds: the same policy on each seed's workload"

# Each column over the seeds: its header, its figure for a run (beside the same batch
# jobs alone), its format, and whether the worst seed has the least of it (else the most).
_SEED_FIGURES: tuple[tuple[str, Callable[[MixedRun, MixedRun], float], str, bool], ...] = (
    ("GPUs doing work", lambda run, _: run.busy_occupancy_pct, "{:.2f}%", True),
    ("batch jobs alone", lambda _, alone: alone.busy_occupancy_pct, "{:.2f}%", True),
    ("wf median burst", lambda run, _: run.workflows["burst"].median, "{:.3f}", False),
    ("wf p99 burst", lambda run, _: run.workflows["burst"].p99, "{:.2f}", False),
    ("wf p99 calm", lambda run, _: run.workflows["calm"].p99, "{:.2f}", False),
    ("serving held mean", lambda run, _: run.serving_held["all"].mean, "{:.1f}", False),
    ("longest stall s", lambda run, _: run.longest_stall_s, "{:.0f}", False),
)


def seeds_table(results: Sequence[SeedRuns]) -> Table:
    """A row per seed and ``serving_max_fraction``, then, per fraction, the mean over the
    seeds and the worst seed's figure in each column (a headline over seeds hides no
    seed: the worst is beside the mean)."""
    header = ["seed", "serving_max_fraction", *(name for name, *_ in _SEED_FIGURES)]
    rows: list[list[str]] = []
    for i in range(len(results[0].runs) if results else 0):
        fraction = f"{results[0].runs[i].serving_max_fraction:g}"
        figures = [
            [figure(seed.runs[i], seed.alone) for _, figure, _, _ in _SEED_FIGURES]
            for seed in results
        ]
        columns = list(zip(*figures, strict=True))
        mean = [sum(column) / len(column) for column in columns]
        worst = [
            min(column) if least else max(column)
            for column, (*_, least) in zip(columns, _SEED_FIGURES, strict=True)
        ]
        labels = [str(seed.seed) for seed in results] + ["mean", "worst"]
        for label, values in zip(labels, [*figures, mean, worst], strict=True):
            cells = [f.format(v) for v, (_, _, f, _) in zip(values, _SEED_FIGURES, strict=True)]
            rows.append([label, fraction, *cells])
    return header, rows


def seeds_markdown(results: Sequence[SeedRuns], settings: MixedSettings) -> str:
    """seeds.md: the table over the seeds, under the workload they share."""
    c = settings.cluster
    lines = [
        f"# {SEEDS_TITLE}",
        "",
        f"{c.describe()}, {settings.hours:g} h window, seeds "
        + ", ".join(str(seed.seed) for seed in results)
        + "; GPUs doing work: batch held + serving running.",
        "",
        *markdown_table(*seeds_table(results)),
        "",
    ]
    return "\n".join(lines)


def markdown(
    runs: Sequence[MixedRun], settings: MixedSettings, alone: MixedRun | None = None
) -> str:
    """The first run in full (beside ``alone``, its batch jobs without workflows), then
    every run side by side."""
    s, c = settings, settings.cluster
    lines = [
        "# Mixed cluster: batch jobs and workflows under one budget",
        "",
        f"{c.describe()} ({c.gpu_memory_gib:g} GiB), budget "
        + ", ".join(f"{n} {w:g}" for n, w in s.teams)
        + f". Batch: Poisson, {s.batch_load:g}× the cluster's GPU time, sizes 1-8, runtimes "
        f"{s.batch_runtime_s[0] / 60:g}-{s.batch_runtime_s[1] / 60:g} min (log-uniform), "
        f"{s.free_share:.0%} free work, "
        f"{s.serving_batch_share:.0%} of jobs from {SERVING_TEAM}. Workflows (the four Compass "
        f"profiles) for {SERVING_TEAM}: Poisson {s.workflow_rate_per_s:g}/s, "
        f"×{s.burst_factor:g} from {s.burst_s[0] / 60:g} to {s.burst_s[1] / 60:g} min. "
        f"Window {s.hours:g} h after {s.warmup_s / 60:g} min of batch work alone; seed {s.seed}. "
        f"Model caches: {runs[0].cache_model.value}.",
        "",
    ]
    for title, (header, rows) in tables(runs[0], alone).items():
        lines += [f"## {title}", "", *markdown_table(header, rows), ""]
    lines += [
        "## serving_max_fraction side by side (same workload)",
        "",
        *markdown_table(*table(COMPARISON, runs)),
        "",
        "Definitions: *serving* GPUs are those the serving core holds from batch work "
        "(busy, in the warm reserve, or idle and not yet lent back), weighted by time; "
        "*busy* counts GPUs running a workflow task "
        "(model loads excluded); *use* is busy ÷ held. Waits run from submission to the first "
        "start, cut at the window's end. Slowdown is a workflow's latency ÷ its published best "
        "case; phases go by arrival. Charges are WindowedUsage over the window, as the "
        "projector folds the task lifecycle and serving's holds: a GPU serving holds is "
        "charged to one allocation, busy or idle, and the workflow tasks on it are not "
        "charged again. *Not doing work*: neither held by batch work nor running a "
        "workflow task.",
        "",
    ]
    return "\n".join(lines)
