"""``qm sim``: run policies on a trace in the simulator and write a report."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from libs.core.config import PolicyConfig
from libs.sim import POLICIES, SimSettings, build_workload, load_scenario
from libs.sim.cluster import ClusterSpec
from libs.sim.compare import run_policies
from libs.sim.metrics import Metrics
from libs.sim.report import SUMMARY_HEADER, RunInfo, summary_rows, write_report
from libs.sim.scenario import TRACES
from libs.sim.traces import TraceError

sim_app = typer.Typer(no_args_is_help=True, help="Simulate scheduling policies on cluster traces.")
console = Console()
errors = Console(stderr=True)

SCENARIOS = Path(__file__).resolve().parent.parent / "deploy" / "sim"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``8h`` or ``7d`` to seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 30m, 8h or 7d")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


@sim_app.command()
def run(
    trace: Annotated[str, typer.Option(help=f"One of {', '.join(TRACES)}")] = "philly",
    policy: Annotated[str, typer.Option(help=f"{', '.join(POLICIES)}, or all")] = "all",
    out: Annotated[Path, typer.Option(help="Folder for metrics.json, summary.md, plots/")] = Path(
        "sim-out"
    ),
    scenario: Annotated[
        Path | None, typer.Option(help="Scenario YAML (default: deploy/sim/TRACE.yaml)")
    ] = None,
    trace_path: Annotated[Path | None, typer.Option(help="The trace or log file")] = None,
    skip_head: Annotated[int | None, typer.Option(help="Drop the first N jobs")] = None,
    start: Annotated[float | None, typer.Option(help="First submission time kept, s")] = None,
    end: Annotated[float | None, typer.Option(help="Submissions before this time, s")] = None,
    nodes: Annotated[int | None, typer.Option(help="Cluster: node count")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="Cluster: GPUs per node")] = None,
    gpu_type: Annotated[str | None, typer.Option(help="Cluster: GPU type")] = None,
    tree: Annotated[Path | None, typer.Option(help="Budget tree YAML")] = None,
    lookback: Annotated[str, typer.Option(help="Fair-share lookback window")] = "7d",
    max_min_runtime: Annotated[str, typer.Option(help="Cap on minimum runtimes")] = "8h",
    tick: Annotated[str, typer.Option(help="Clock tick period")] = "60s",
    snapshot: Annotated[str, typer.Option(help="Usage snapshot period")] = "300s",
    grace: Annotated[str, typer.Option(help="Stop grace before a task ends")] = "30s",
    drain: Annotated[str, typer.Option(help="Simulate on after the last submission")] = "0",
    warmup: Annotated[
        str | None, typer.Option(help="Measure from this long after the first submission")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots")] = True,
) -> None:
    """Simulate: qm sim run --trace philly --policy all --out sim-out"""
    names = POLICIES if policy == "all" else tuple(policy.split(","))
    if unknown := [n for n in names if n not in POLICIES]:
        raise typer.BadParameter(f"unknown policy {unknown}; use {', '.join(POLICIES)} or all")
    try:
        sc = load_scenario(scenario or SCENARIOS / f"{trace}.yaml")
    except (OSError, TraceError) as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    cluster = sc.cluster or ClusterSpec()
    resized = dataclasses.replace(
        cluster,
        nodes=nodes if nodes is not None else cluster.nodes,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else cluster.gpus_per_node,
        gpu_type=gpu_type if gpu_type is not None else cluster.gpu_type,
    )
    # A recorded log brings its own nodes unless the cluster is given here.
    sized_here = any(v is not None for v in (nodes, gpus_per_node, gpu_type))
    sc = dataclasses.replace(
        sc,
        path=trace_path or sc.path,
        tree_path=tree or sc.tree_path,
        cluster=resized if sc.cluster or sized_here else None,
        skip_head=skip_head if skip_head is not None else sc.skip_head,
        start_s=start if start is not None else sc.start_s,
        end_s=end if end is not None else sc.end_s,
        warmup_s=parse_duration(warmup) if warmup is not None else sc.warmup_s,
    )
    config = PolicyConfig(
        lookback_window_s=parse_duration(lookback),
        max_min_runtime_s=parse_duration(max_min_runtime),
    )
    settings = SimSettings(
        tick_s=parse_duration(tick),
        snapshot_s=parse_duration(snapshot),
        stop_grace_s=parse_duration(grace),
        lookback_window_s=config.lookback_window_s,
        gpu_prices=config.gpu_prices,
        drain_s=parse_duration(drain),
        warmup_s=sc.warmup_s,
    )
    try:
        workload = build_workload(sc, config.max_min_runtime_s)
    except (OSError, TraceError) as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(
        f"{len(workload.jobs)} jobs, {workload.capacity} GPUs on {len(workload.nodes)} nodes, "
        f"offered load {workload.offered_load():.2f}× capacity"
    )

    def done(m: Metrics) -> None:
        console.print(f"  {m.policy}: simulated in {m.sim_wall_s:.1f} s ({m.sim_cpu_s:.1f} s CPU)")

    results = run_policies(workload, names, config, settings, on_done=done)
    written = []
    if plots:
        from libs.sim.plots import write_plots  # matplotlib is slow to import

        written = write_plots(results, out / "plots")
    write_report(out, RunInfo(sc, config, settings), workload, results, written)
    table = Table(*SUMMARY_HEADER, title=f"{sc.trace}: {workload.capacity} GPUs")
    for row in summary_rows(results):
        table.add_row(*row)
    console.print(table)
    console.print(
        f"wrote {out / 'metrics.json'}, {out / 'summary.md'}" + (", plots/" if plots else "")
    )


_PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "compass" / "workflows.json"


@sim_app.command()
def workflows(
    gpus: Annotated[
        str, typer.Option(help="GPU counts to sweep, comma-separated")
    ] = "16,32,64,128",
    modes: Annotated[str, typer.Option(help="compass, heft, hash, jit, or all")] = "all",
    jobs: Annotated[int, typer.Option(help="Jobs per run (the first 10% are warm-up)")] = 1000,
    rate: Annotated[float, typer.Option(help="Arrivals per second, all workflows")] = 40.0,
    burst: Annotated[float, typer.Option(help="Gamma shape of inter-arrivals; 0: Poisson")] = 0.0,
    profiles: Annotated[Path, typer.Option(help="Compass workflow profiles")] = _PROFILES,
    out: Annotated[Path | None, typer.Option(help="Write the sweep plot here (a folder)")] = None,
) -> None:
    """Sweep GPU counts: median and p99 slowdown of the Compass workflows per placement mode."""
    import json
    import time

    from libs.core.compass import Costs, PlanMode, WorkflowError, parse_workflow
    from libs.sim.workflows import simulate

    try:
        raw = json.loads(profiles.read_text())
        c = raw["cluster"]
        costs = Costs(c["host_to_gpu_mb_per_ms"], c["node_to_node_mb_per_ms"], c["gpu_memory_mb"])
        flows = [
            parse_workflow(n, w["tasks"], raw["models"], costs) for n, w in raw["workflows"].items()
        ]
    except (OSError, KeyError, ValueError, WorkflowError) as exc:
        errors.print(f"[red]error:[/] {profiles}: {exc}")
        raise typer.Exit(2) from exc
    best = {n: w["best_case_ms"] for n, w in raw["workflows"].items()}
    chosen = list(PlanMode) if modes == "all" else [PlanMode(m) for m in modes.split(",")]
    table = Table("GPUs", "mode", "median slowdown", "p99 slowdown", "cache hits", "GPUs used", "s")
    per_flow = Table("GPUs", "mode", *(f"{f.name} (slowdown / hits)" for f in flows))
    runs = []
    for count in (int(g) for g in gpus.split(",")):
        for mode in chosen:
            began = time.perf_counter()
            run = simulate(
                flows,
                best,
                costs,
                mode=mode,
                gpus=count,
                jobs=jobs,
                rate_per_s=rate,
                burst_shape=burst,
            )
            table.add_row(
                str(count),
                mode.value,
                f"{run.median_slowdown:.2f}",
                f"{run.p99_slowdown:.1f}",
                f"{run.cache_hit_rate:.0%}",
                str(run.gpus_used),
                f"{time.perf_counter() - began:.1f}",
            )
            per_flow.add_row(
                str(count),
                mode.value,
                *(
                    f"{run.per_workflow[f.name][0]:.2f} / {run.per_workflow[f.name][1]:.0%}"
                    for f in flows
                ),
            )
            runs.append(run)
    console.print(table)
    console.print(per_flow)
    if out is not None:
        from libs.sim.sweep_plot import write_sweep_plot

        console.print(f"wrote {write_sweep_plot(runs, out / 'sweep.png')}")
