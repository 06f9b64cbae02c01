"""The workflow sweep as a picture: GPUs available against median and p99 slowdown,
one row per arrival process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from libs.sim.workflows import SweepRun

_STYLE = {"compass": "o-", "heft": "s--", "hash": "^:", "jit": "d-."}


def write_sweep_plot(runs: Sequence[SweepRun], path: Path) -> Path:
    processes = list(dict.fromkeys(r.arrivals for r in runs))
    fig = Figure(figsize=(10, 3.6 * len(processes)))
    FigureCanvasAgg(fig)
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
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path
