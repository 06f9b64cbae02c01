"""PNG plots: of a trace run (one figure per question, every policy side by side), of the
workflow sweep and of mixed-cluster runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from libs.core.service_level import TARGET_DELIVERED_PCT
from libs.sim.mixed_results import MixedRun
from libs.sim.recorder import CLASSES, Distribution, Metrics
from libs.sim.workflows import SweepRun

_CLASS_COLOURS = {"debug": "tab:green", "allocated": "tab:blue", "unallocated": "tab:gray"}


def write_plots(results: Sequence[Metrics], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "occupancy": _occupancy(results),
        "owed_delivered": _owed_delivered(results),
        "owed_by_day": _owed_by_day(results),
        "waits": _cdfs(results, "waits", "queue wait by class"),
        "jct": _cdfs(results, "jct", "job completion time by class"),
        "preemptions": _preemptions(results),
    }
    return [_save(figure, out / f"{name}.png") for name, figure in figures.items()]


def _occupancy(results: Sequence[Metrics]) -> Figure:
    fig = _figure(11, 2.8 * len(results))
    axes = fig.subplots(len(results), 1, squeeze=False)
    for ax, m in zip(axes[:, 0], results, strict=True):
        s = m.series
        hours = [i * s.step_s / 3600 for i in range(len(s.waiting_gpus))]
        ax.stackplot(
            hours,
            *(s.busy[c] for c in CLASSES),
            labels=CLASSES,
            colors=[_CLASS_COLOURS[c] for c in CLASSES],
            alpha=0.8,
        )
        ax.axhline(m.capacity, color="black", linewidth=0.8, label="capacity")
        ax.set_ylim(0, m.capacity * 1.1)
        ax.set_ylabel("GPUs held")
        ax.set_title(f"{m.policy}: occupancy {m.occupancy_pct:.1f}%")
        _legend(ax, loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("hours into the measured window")
    fig.tight_layout()
    return fig


def _owed_delivered(results: Sequence[Metrics]) -> Figure:
    fig = _figure(5 * len(results), 4)
    axes = fig.subplots(1, len(results), squeeze=False)
    for ax, m in zip(axes[0], results, strict=True):
        names = [a.name + ("*" if a.enough_demand else "") for a in m.allocations]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [a.owed_gpu_h for a in m.allocations], 0.4, label="owed")
        ax.bar(
            [x + 0.2 for x in xs],
            [a.delivered_gpu_h for a in m.allocations],
            0.4,
            label="delivered",
        )
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("GPU-hours")
        ax.set_title(f"{m.policy} (* enough demand)")
        _legend(ax, fontsize=8)
    fig.tight_layout()
    return fig


def _owed_by_day(results: Sequence[Metrics]) -> Figure:
    """Each team's delivered ÷ owed per day of the window, against the target."""
    fig = _figure(11, 2.8 * len(results))
    axes = fig.subplots(len(results), 1, squeeze=False)
    for ax, m in zip(axes[:, 0], results, strict=True):
        for a in m.allocations:
            days = [(d + 1, p) for d, p in enumerate(a.delivered_pct_by_day) if p is not None]
            if days:
                ax.plot(*zip(*days, strict=True), "o-", markersize=3, label=a.name)
        ax.axhline(TARGET_DELIVERED_PCT, color="black", linestyle="--", linewidth=0.8)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("delivered ÷ owed, %")
        ax.set_title(f"{m.policy}: owed delivered per day (target {TARGET_DELIVERED_PCT:.0f}%)")
        _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1, 0].set_xlabel("day of the measured window")
    fig.tight_layout()
    return fig


def _cdfs(results: Sequence[Metrics], field: str, title: str) -> Figure:
    fig = _figure(14, 4)
    axes = fig.subplots(1, len(CLASSES), squeeze=False)
    for ax, work_class in zip(axes[0], CLASSES, strict=True):
        for m in results:
            dist: Distribution = getattr(m, field)[work_class]
            if dist.count:
                seconds = [max(v, 1.0) for v in dist.percentiles]
                ax.plot(seconds, range(101), label=f"{m.policy} (p90 {_short(dist.p90)})")
        ax.set_xscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("percent of jobs")
        ax.set_title(f"{work_class}")
        _legend(ax, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _preemptions(results: Sequence[Metrics]) -> Figure:
    fig = _figure(13, 4)
    timeline, by_class = fig.subplots(1, 2)
    for m in results:
        s = m.series
        hours = [i * s.step_s / 3600 for i in range(len(s.preemptions))]
        timeline.plot(hours, s.preemptions, label=m.policy)
    timeline.set_xlabel("hours into the measured window")
    timeline.set_ylabel("preemptions so far")
    _legend(timeline, fontsize=8)
    width = 0.8 / max(len(results), 1)
    for i, m in enumerate(results):
        xs = [c + i * width for c in range(len(CLASSES))]
        by_class.bar(xs, [m.preemptions[c] for c in CLASSES], width, label=m.policy)
    by_class.set_xticks([c + 0.4 - width / 2 for c in range(len(CLASSES))], CLASSES)
    by_class.set_ylabel("jobs preempted, by their class")
    _legend(by_class, fontsize=8)
    fig.tight_layout()
    return fig


_STYLE = {"compass": "o-", "heft": "s--", "hash": "^:", "jit": "d-."}


def write_sweep_plot(runs: Sequence[SweepRun], path: Path) -> Path:
    """GPUs available against median and p99 slowdown, one row per arrival process."""
    processes = list(dict.fromkeys(r.arrivals for r in runs))
    fig = _figure(10, 3.6 * len(processes))
    axes = fig.subplots(len(processes), 2, squeeze=False)
    for row, name in zip(axes, processes, strict=True):
        mine = [r.run for r in runs if r.arrivals == name]
        median_ax, p99_ax = row
        for mode in sorted({r.mode for r in mine}, key=lambda m: m.value):
            points = sorted((r for r in mine if r.mode is mode), key=lambda r: r.gpus)
            gpus = [r.gpus for r in points]
            style = _STYLE.get(mode.value, "o-")
            median_ax.plot(gpus, [r.median_slowdown for r in points], style, label=mode.value)
            p99_ax.plot(gpus, [r.p99_slowdown for r in points], style, label=mode.value)
        for ax, title in ((median_ax, "median slowdown"), (p99_ax, "p99 slowdown")):
            ax.set_xlabel("GPUs available")
            ax.set_yscale("log")
            ax.set_title(f"{title} ({name} arrivals)")
            ax.grid(True, alpha=0.3)
            _legend(ax)
    fig.tight_layout()
    return _save(fig, path)


def write_mixed_plot(runs: Sequence[MixedRun], path: Path) -> Path:
    """GPUs held by batch work (by class) and by serving over time, one panel per run."""
    fig = _figure(13, 3.4 * len(runs))
    axes = fig.subplots(len(runs), 1, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        hours = [p.at_s / 3600 for p in run.series]
        ax.stackplot(
            hours,
            [p.serving_held for p in run.series],
            *([p.batch[i] for p in run.series] for i in range(3)),
            labels=["serving (held)", *(f"batch {c}" for c in CLASSES)],
            colors=["tab:orange", "tab:green", "tab:blue", "tab:gray"],
            alpha=0.8,
            step="post",
        )
        ax.step(
            hours,
            [p.serving_active for p in run.series],
            where="post",
            color="tab:red",
            linewidth=0.8,
            label="serving (with work)",
        )
        ax.axhline(run.serving_cap, color="tab:orange", linestyle="--", linewidth=0.8)
        ax.axhline(run.capacity, color="black", linewidth=0.8)
        for edge, label in zip(run.burst_s, ("burst", None), strict=True):
            ax.axvline(edge / 3600, color="black", linestyle=":", linewidth=1.2, label=label)
        ax.set_ylim(0, run.capacity * 1.02)
        ax.set_xlim(0, run.window_s / 3600)
        ax.set_ylabel("GPUs")
        ax.set_title(
            f"serving_max_fraction {run.serving_max_fraction:g} (cap {run.serving_cap}): "
            f"serving held mean {run.serving_held['all'].mean:.1f}, "
            f"batch occupancy {run.batch_occupancy_pct:.1f}%"
        )
        _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1, 0].set_xlabel("hours into the measured window")
    fig.tight_layout()
    return _save(fig, path)


def _legend(ax: Axes, **options: Any) -> None:
    """A legend of what the axes drew, if they drew anything labelled: a team with no
    day owed, or a class with no jobs, leaves an empty panel, not an empty legend (which
    matplotlib warns of)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)


def _figure(width: float, height: float) -> Figure:
    """A figure drawn by Agg, outside pyplot: no global state, no display needed."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path


def _short(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
