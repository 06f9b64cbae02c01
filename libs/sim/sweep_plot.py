"""The workflow sweep as a picture: GPUs available against median and p99 slowdown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from libs.sim.workflows import WorkflowRun


def write_sweep_plot(runs: Sequence[WorkflowRun], path: Path) -> Path:
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    median_ax, p99_ax = fig.subplots(1, 2)
    for mode in sorted({r.mode for r in runs}, key=lambda m: m.value):
        mine = sorted((r for r in runs if r.mode is mode), key=lambda r: r.gpus)
        gpus = [r.gpus for r in mine]
        median_ax.plot(gpus, [r.median_slowdown for r in mine], marker="o", label=mode.value)
        p99_ax.plot(gpus, [r.p99_slowdown for r in mine], marker="o", label=mode.value)
    for ax, title in ((median_ax, "median slowdown"), (p99_ax, "p99 slowdown")):
        ax.set_xlabel("GPUs available")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path
