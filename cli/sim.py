"""``qm sim``: run policies on a trace in the simulator and write a report."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from cli.groups import group
from cli.output import Format, OutputFlag, notes, records, stdout_console, write
from cli.params import SEED_MAX, duration, input_file, knob, number
from cli.progress import counting, fractions
from cli.render import errors, fail
from libs.config.document import ConfigError
from libs.config.policy import load_policy
from libs.core.compass import CacheModel
from libs.core.config import PolicyConfig
from libs.core.limits import MAX_SERVING_RESERVE, MAX_SERVING_RESERVE_MIN
from libs.sim import POLICIES, SimSettings, build_workload
from libs.sim.cluster import ClusterSpec
from libs.sim.compare import run_policies
from libs.sim.recorder import Metrics
from libs.sim.report import SUMMARY, RunInfo, left_out_note, left_out_records, write_report
from libs.sim.scenario import Trace
from libs.sim.scenario_file import load_scenario
from libs.sim.tables import table
from libs.sim.traces import TraceError
from libs.sim.workflows import PROFILES

sim_app = group("Simulate scheduling policies on cluster traces.")
console = stdout_console()

SCENARIOS = Path(__file__).resolve().parent.parent / "deploy" / "sim"
# Trace times: seconds from the trace's start (or epoch seconds in a recorded log).
TRACE_TIME_MAX = 1e12
MANY = 1_000_000_000


def _out_dir(path: Path) -> Path:
    """The output folder, made before any work so that a bad one fails fast."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot create {path}: {exc.strerror}", param_hint="--out"
        ) from None
    return path


Shown = tuple[str, list[str], list[list[str]]]  # a printed table: title, header, rows


def _print(to: Console, title: str, header: list[str], rows: list[list[str]]) -> None:
    shown = Table(*header, title=title)
    for row in rows:
        shown.add_row(*row)
    to.print(shown)


def _show(output: Format, tables: list[Shown], **facts: object) -> None:
    """The report's tables: printed whole (a terminal gets its width), or, under json and
    yaml, {**facts, "tables": [{"title", "rows": [{column: cell}]}]}."""
    if output is Format.TABLE:
        for table in tables:
            _print(console, *table)
        return
    shown = [{"title": title, "rows": records(header, rows)} for title, header, rows in tables]
    write(output, {**facts, "tables": shown})


@sim_app.command()
def run(
    trace: Annotated[Trace, typer.Option(help="The trace to replay")] = "philly",
    policy: Annotated[str, typer.Option(help=f"{', '.join(POLICIES)}, or all")] = "all",
    out: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Folder for metrics.json, summary.md, plots/ (without it, nothing is written)",
        ),
    ] = None,
    scenario: Annotated[
        Path | None,
        input_file("Scenario YAML (default: deploy/sim/TRACE.yaml)"),
    ] = None,
    trace_path: Annotated[
        Path | None,
        input_file("The trace or log file"),
    ] = None,
    skip_head: Annotated[
        int | None, typer.Option(min=0, max=MANY, help="Drop the first N jobs")
    ] = None,
    start: Annotated[
        float | None,
        number("First submission time kept, s", least=0, most=TRACE_TIME_MAX),
    ] = None,
    end: Annotated[
        float | None,
        number("Submissions before this time, s", least=0, most=TRACE_TIME_MAX),
    ] = None,
    nodes: Annotated[int | None, typer.Option(min=1, max=100_000, help="Cluster: nodes")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(min=1, max=1024, help="Cluster: GPUs per node")
    ] = None,
    gpu_type: Annotated[str | None, typer.Option(help="Cluster: GPU type")] = None,
    tree: Annotated[
        Path | None,
        input_file("Budget tree YAML"),
    ] = None,
    seed: Annotated[
        str | None,
        typer.Option(
            help="Seed of the hashed draws (teams of users the tree does not name, "
            "contracts): another seed is another team structure on the same trace, "
            "a held-out check [default: the scenario's]"
        ),
    ] = None,
    policy_file: Annotated[
        Path | None,
        input_file("The policy's knobs (YAML, as placement reads QM_POLICY_FILE)"),
    ] = None,
    lookback: Annotated[
        float | None, duration("the policy file's, else 7d", "Fair-share lookback", positive=True)
    ] = None,
    max_min_runtime: Annotated[
        float | None, duration("the policy file's, else 8h", "Cap on minimum runtimes")
    ] = None,
    tick: Annotated[float, duration("60s", "Clock tick period", positive=True)] = 60.0,
    snapshot: Annotated[float, duration("300s", "Usage snapshot period", positive=True)] = 300.0,
    grace: Annotated[float, duration("30s", "Stop grace before a task ends")] = 30.0,
    checkpoint: Annotated[
        float,
        duration("0", "How often resumable work checkpoints (0: it saves when told to stop)"),
    ] = 0.0,
    drain: Annotated[float, duration("0", "Simulate on after the last submission")] = 0.0,
    warmup: Annotated[
        float | None,
        duration("the scenario's", "Measure from this long after the first submission"),
    ] = None,
    plots: Annotated[bool, typer.Option(help="With --out: write PNG plots in its plots/")] = True,
    output: OutputFlag = Format.TABLE,
) -> None:
    """Simulate: qm sim run --trace philly --policy all --out sim-out

    Prints the summary table; --out writes the whole report there. A recorded log
    (--trace eventlog) replays each job's recorded run: a job without one is left out,
    and the report counts those and says why.

    -o json|yaml: {"trace", "jobs", "left_out": [{"job_id", "why"}], "gpus", "nodes",
    "offered_load", "wrote": [paths], "tables": [{"title", "rows": [{column: cell}]}]},
    the summary table as printed; metrics.json in --out holds every number.
    """
    say = notes(console, errors, output)
    names = POLICIES if policy == "all" else tuple(policy.split(","))
    if unknown := [n for n in names if n not in POLICIES]:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown)}; use {', '.join(POLICIES)} or all",
            param_hint="--policy",
        )
    try:
        sc = load_scenario(scenario or SCENARIOS / f"{trace}.yaml")
    except ConfigError as exc:
        raise fail(exc) from exc
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
        label="" if trace_path else sc.label,  # the scenario's label names its own file
        tree_path=tree or sc.tree_path,
        cluster=resized if sc.cluster or sized_here else None,
        skip_head=skip_head if skip_head is not None else sc.skip_head,
        start_s=start if start is not None else sc.start_s,
        end_s=end if end is not None else sc.end_s,
        warmup_s=warmup if warmup is not None else sc.warmup_s,
    )
    if seed is not None:
        if not seed.strip():
            raise typer.BadParameter("give a non-empty seed", param_hint="--seed")
        sc = dataclasses.replace(sc, rules=dataclasses.replace(sc.rules, seed=seed))
    if sc.start_s is not None and sc.end_s is not None and sc.end_s <= sc.start_s:
        raise typer.BadParameter(
            f"the window ends ({sc.end_s:g} s) before it starts ({sc.start_s:g} s)",
            param_hint="--start/--end",
        )
    try:
        config = load_policy(policy_file) if policy_file else PolicyConfig()
    except ConfigError as exc:
        raise fail(exc) from exc
    if lookback is not None:
        config = dataclasses.replace(config, lookback_window_s=lookback)
    if max_min_runtime is not None:
        config = dataclasses.replace(config, max_min_runtime_s=max_min_runtime)
    settings = SimSettings(
        tick_s=tick,
        snapshot_s=snapshot,
        stop_grace_s=grace,
        checkpoint_s=checkpoint,
        lookback_window_s=config.lookback_window_s,
        gpu_prices=config.gpu_prices,
        drain_s=drain,
        warmup_s=sc.warmup_s,
    )
    out = _out_dir(out) if out is not None else None
    try:
        workload = build_workload(sc, config.max_min_runtime_s)
    except (TraceError, ConfigError) as exc:
        raise fail(exc) from exc
    if not workload.jobs:
        raise fail(f"{sc.path}: no jobs in the chosen window (--skip-head, --start, --end)")
    say.print(
        f"{len(workload.jobs)} jobs, {workload.capacity} GPUs on {len(workload.nodes)} nodes, "
        f"offered load {workload.offered_load():.2f}× capacity"
    )
    if left_out := left_out_note(workload):
        say.print(left_out + (f" (listed in {out / 'summary.md'})" if out else ""))

    def done(m: Metrics) -> None:
        say.print(f"  {m.policy}: simulated in {m.sim_wall_s:.1f} s ({m.sim_cpu_s:.1f} s CPU)")

    with fractions(console) as progress:
        results = run_policies(
            workload, names, config, settings, on_done=done, on_progress=progress
        )
    wrote: list[Path] = []
    if out is not None:
        plotted: list[Path] = []
        if plots:
            from libs.sim.plots import write_plots  # matplotlib is slow to import

            plotted = write_plots(results, out / "plots")
        write_report(out, RunInfo(sc, config, settings), workload, results, plotted)
        wrote = [out / "metrics.json", out / "summary.md", *plotted]
    _show(
        output,
        [(f"{sc.trace}: {workload.capacity} GPUs", *table(SUMMARY, results))],
        trace=sc.trace,
        jobs=len(workload.jobs),
        left_out=left_out_records(workload),
        gpus=workload.capacity,
        nodes=len(workload.nodes),
        offered_load=workload.offered_load(),
        wrote=[str(path) for path in wrote],
    )
    if out is None:
        say.print("nothing written: --out DIR writes metrics.json, summary.md and plots/")
        return
    say.print(f"wrote {out / 'metrics.json'}, {out / 'summary.md'}" + (", plots/" if plots else ""))


_SWEEP = "16,24,32,48,64,96,128"
Item = TypeVar("Item")


def _items(
    flag: str,
    text: str,
    kind: Callable[[str], Item],
    allowed: Callable[[Item], bool] | None,
    expected: str,
    may_be_empty: bool = False,
) -> list[Item]:
    """A comma-separated flag's items, each converted by ``kind`` and ``allowed``."""
    items = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        try:
            item = kind(word)
        except ValueError:
            raise typer.BadParameter(f"{word!r}: expected {expected}", param_hint=flag) from None
        if allowed is not None and not allowed(item):
            raise typer.BadParameter(f"{word!r}: expected {expected}", param_hint=flag)
        items.append(item)
    if not items and not may_be_empty:
        raise typer.BadParameter(f"expected {expected}, comma-separated", param_hint=flag)
    return items


CacheModelFlag = Annotated[
    CacheModel,
    typer.Option(
        "--cache-model",
        help="How each GPU's model cache makes room: lookahead (the node agent's: the model "
        "needed furthest ahead, free) or fifo-cost (the Compass paper's simulator: first "
        "loaded first, each eviction costing its transfer)",
    ),
]


def _seed_list(text: str) -> list[int]:
    """``--seeds``: a comma list of seeds and ranges (``1-5``), each seed once, in order."""
    seeds: dict[int, None] = {}
    expected = f"seeds from 0 to {SEED_MAX}, comma-separated, or ranges like 1-5"
    for word in _items("--seeds", text, str, None, expected):
        low, dash, high = word.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise typer.BadParameter(
                f"{word!r}: expected {expected}", param_hint="--seeds"
            ) from None
        if not 0 <= first <= last <= SEED_MAX or last - first >= 1000:
            raise typer.BadParameter(
                f"{word!r}: expected {expected} (at most 1000 in a range)", param_hint="--seeds"
            )
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return list(seeds)


@sim_app.command()
def workflows(
    gpus: Annotated[str, typer.Option(help="GPU counts to sweep, comma-separated")] = _SWEEP,
    modes: Annotated[str, typer.Option(help="compass, heft, hash, jit, or all")] = "all",
    arrivals: Annotated[
        str, typer.Option(help="poisson, gamma or both (comma-separated)")
    ] = "poisson,gamma",
    jobs: Annotated[
        int, typer.Option(min=10, max=MANY, help="Jobs per run (the first 10% are warm-up)")
    ] = 1000,
    rate: Annotated[
        float, number("Arrivals per second, all workflows", least=0.001, most=1e6)
    ] = 40.0,
    burst: Annotated[
        float,
        number("Gamma shape of the bursty inter-arrivals (CV = 1/sqrt)", least=0.001, most=1000),
    ] = 0.25,
    seed: Annotated[
        int, typer.Option(min=0, max=SEED_MAX, help="Seeds the arrivals and the workflow mix")
    ] = 7,
    seeds: Annotated[
        str,
        typer.Option(
            help="Several seeds instead of --seed, each a run of every setting: a comma "
            "list or a range (1-5); the tables then add each setting's median over them",
            show_default=False,
        ),
    ] = "",
    hold_threshold: Annotated[
        float, knob("compass's hold_threshold policy knob (0: plan on arrival)")
    ] = PolicyConfig.hold_threshold,
    due_slack: Annotated[
        float,
        knob(
            "compass's due_slack policy knob: held workflows go earliest due first, "
            "due = arrival + this × best case (0: oldest first)"
        ),
    ] = PolicyConfig.due_slack,
    admit_load: Annotated[
        float,
        knob(
            "compass's admit_load policy knob: under overload the workflows with the most "
            "work wait while the work arriving is more than this × the GPUs' time (0: none)"
        ),
    ] = PolicyConfig.admit_load,
    arrival_window: Annotated[
        float,
        duration(
            "4s",
            "compass's arrival_window_s policy knob: admit_load counts the work that "
            "arrived over twice this, the older the less",
            positive=True,
        ),
    ] = PolicyConfig.arrival_window_s,
    admit_window: Annotated[
        float,
        duration(
            "1s",
            "compass's admit_window_s policy knob: admit_load counts the work admitted "
            "over twice this, the older the less",
            positive=True,
        ),
    ] = PolicyConfig.admit_window_s,
    profiles: Annotated[
        Path,
        input_file("Compass profiles"),
    ] = PROFILES,
    out: Annotated[
        Path | None,
        typer.Option(file_okay=False, help="Write sweep.png and sweep.md (every table) here"),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help="Processes running runs side by side [default: one per core]",
            show_default=False,
        ),
    ] = None,
    cache_model: CacheModelFlag = CacheModel.LOOKAHEAD,
    staleness: Annotated[
        float,
        duration(
            "0",
            "How old the planner's picture of the GPUs is: every worker report (load, "
            "eviction, start, end) reaches the scheduler this late (e.g. 10ms)",
        ),
    ] = 0.0,
    planners: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Planners splitting the arrivals in turn; each knows its own sends at once "
            "and the others' only as it reads their placements off the log, --staleness late",
        ),
    ] = 1,
    output: OutputFlag = Format.TABLE,
) -> None:
    """Sweep GPU counts: the Compass workflows through the scheduler's serving core, per mode.

    Prints median and p99 slowdown, latency, cache hits, GPUs used, how long
    workflows were held before their plan and the mean per-task breakdown per
    run, the per-workflow table, the claims and the runtime.

    -o json|yaml: {"runs", "seeds", "wall_s", "cache_model", "staleness_ms", "planners",
    "claims":
    [{"text", "holds"}],
    "tables": [{"title", "rows": [{column: cell}]}]}, the tables as printed.
    """
    from libs.core.compass import PlanMode
    from libs.sim.workflows import (
        ARRIVALS,
        SweepRun,
        claims,
        load_profiles,
        markdown,
        over_seeds,
        run_label,
        sweep,
    )
    from libs.sim.workflows import tables as report_tables

    say = notes(console, errors, output)
    sizes = _items("--gpus", gpus, int, lambda g: 1 <= g <= 100_000, "GPU counts from 1 to 100000")
    kinds = ", ".join(m.value for m in PlanMode)
    chosen = list(PlanMode) if modes == "all" else _items("--modes", modes, PlanMode, None, kinds)
    names = _items("--arrivals", arrivals, str, ARRIVALS.__contains__, ", ".join(ARRIVALS))
    processes = {a: (burst if ARRIVALS[a] else 0.0) for a in names}
    out = _out_dir(out) if out is not None else None
    try:
        loaded = load_profiles(profiles)
    except ConfigError as exc:
        raise fail(exc) from exc

    began = time.perf_counter()
    several = _seed_list(seeds) if seeds else [seed]
    total_runs = len(sizes) * len(chosen) * len(processes) * len(several)
    ended: list[SweepRun] = []
    with fractions(console) as progress:

        def tell(done: SweepRun) -> None:
            r = done.run
            ended.append(done)
            if progress is not None:
                progress(run_label(done.arrivals, r.gpus, r.mode, done.seed), 1.0)
            say.print(
                f"  [{len(ended)}/{total_runs}] {done.arrivals} {r.gpus:>4} GPUs "
                f"{r.mode.value:<8} seed {done.seed:<3} median {r.median_slowdown:7.3f}  "
                f"p99 {r.p99_slowdown:7.2f}  ({done.wall_s:.1f} s)"
            )

        runs = sweep(
            loaded,
            sizes,
            chosen,
            processes,
            workers=workers or len(os.sched_getaffinity(0)),
            seeds=several,
            jobs=jobs,
            rate_per_s=rate,
            hold_threshold=hold_threshold,
            due_slack=due_slack,
            admit_load=admit_load,
            arrival_window_s=arrival_window,
            admit_window_s=admit_window,
            cache_model=cache_model,
            staleness_ms=staleness * 1000,
            planners=planners,
            on_run=tell,
            on_progress=progress,
        )
    total = time.perf_counter() - began
    tables = report_tables(runs, per_task=False)  # sweep.md (--out) has the tasks' too
    found = claims(over_seeds(runs))  # one seed: its own runs
    _show(
        output,
        tables,
        runs=len(runs),
        seeds=several,
        wall_s=round(total, 3),
        cache_model=cache_model.value,
        staleness_ms=staleness * 1000,
        planners=planners,
        claims=[{"text": c.text, "holds": c.holds} for c in found],
    )
    for claim in found:
        say.print(("[green]yes[/] " if claim.holds else "[red]no[/]  ") + claim.text)
    say.print(f"sweep: {len(runs)} runs in {total:.1f} s")
    if out is not None:
        from libs.sim.plots import write_sweep_plot

        (out / "sweep.md").write_text(markdown(runs, total))
        say.print(f"wrote {write_sweep_plot(runs, out / 'sweep.png')}, {out / 'sweep.md'}")


@sim_app.command()
def mixed(
    hours: Annotated[
        float, number("Measured window; workflows arrive in it", least=0.01, most=10_000)
    ] = 2.0,
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="Cluster: node count")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=1024, help="Cluster: GPUs per node")] = 8,
    serving_max_fraction: Annotated[
        float,
        number("Policy: the most of the cluster serving may hold", least=0.001, most=1),
    ] = 0.5,
    serving_linger: Annotated[
        float, duration("30s", "Policy: a drained serving GPU goes back to batch after this")
    ] = PolicyConfig.serving_linger_s,
    serving_lend: Annotated[
        float,
        duration(
            "0s", "Policy: a drained serving GPU beyond the warm reserve goes back after this"
        ),
    ] = PolicyConfig.serving_lend_s,
    serving_reserve: Annotated[
        float,
        knob(
            "Policy: spare serving GPUs per square root of its load (the pool holds its "
            "load and these; GPUs batch work leaves free count too)",
            maximum=MAX_SERVING_RESERVE,
        ),
    ] = PolicyConfig.serving_reserve,
    serving_load_window: Annotated[
        float,
        duration(
            "30s", "Policy: serving's load is the mean of its busy GPUs over this", positive=True
        ),
    ] = PolicyConfig.serving_load_window_s,
    serving_reserve_min: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_SERVING_RESERVE_MIN, help="Policy: the warm reserve's least size"
        ),
    ] = PolicyConfig.serving_reserve_min,
    compare: Annotated[
        str, typer.Option(help="Also run these serving_max_fraction values ('' for none)")
    ] = "0.1",
    rate: Annotated[
        float,
        number("Workflow arrivals per second outside the burst", least=0.001, most=1e6),
    ] = 2.0,
    burst: Annotated[
        float, number("Arrival rate × this during the burst", least=0.001, most=1000)
    ] = 4.0,
    burst_start: Annotated[
        float, duration("40m", "Burst begins this far into the window")
    ] = 2400.0,
    burst_end: Annotated[float, duration("80m", "Burst ends this far into the window")] = 4800.0,
    batch_load: Annotated[
        float, number("Batch GPU time offered ÷ the cluster's", least=0.001, most=1000)
    ] = 2.0,
    warmup: Annotated[float, duration("30m", "Batch work alone before the window")] = 1800.0,
    seed: Annotated[int, typer.Option(min=0, max=SEED_MAX, help="Seeds both arrival streams")] = 7,
    seeds: Annotated[
        str,
        typer.Option(
            help="Several seeds instead of --seed, a comma list or a range (1-12): each seed "
            "runs every fraction and its batch jobs alone, and one table shows them all, "
            "with the mean and the worst seed",
            show_default=False,
        ),
    ] = "",
    parallel: Annotated[bool, typer.Option(help="Run the compared settings side by side")] = True,
    cache_model: CacheModelFlag = CacheModel.LOOKAHEAD,
    profiles: Annotated[
        Path,
        input_file("Compass profiles"),
    ] = PROFILES,
    out: Annotated[
        Path | None, typer.Option(file_okay=False, help="Write summary.md and mixed.png here")
    ] = None,
    output: OutputFlag = Format.TABLE,
) -> None:
    """Batch jobs and workflows on one cluster under one budget: how the policy divides GPUs.

    One simulated run through the core Scheduler (GpuWorkers for serving, simulated
    node agents for batch), then the same workload under each --compare fraction, and
    the same batch jobs alone (no workflows): the baseline for what serving costs.

    With --seeds, each seed's runs and baseline, and a single table over them, with the
    mean and the worst seed (--out: seeds.md).

    -o json|yaml: {"fractions", "cache_model", "wall_s", "tables": [{"title", "rows":
    [{column: cell}]}]}, the tables as printed (with --seeds, "seeds" too).
    """
    from libs.sim.mixed import run_seeds
    from libs.sim.mixed_report import (
        COMPARISON,
        SEEDS_TITLE,
        markdown,
        seeds_markdown,
        seeds_table,
        tables,
    )
    from libs.sim.mixed_workload import MixedSettings
    from libs.sim.workflows import load_profiles

    extra = _items("--compare", compare, float, lambda f: 0 < f <= 1, "fractions in (0, 1]", True)
    several = _seed_list(seeds) if seeds else []
    if burst_end < burst_start:
        raise typer.BadParameter("the burst ends before it begins", param_hint="--burst-end")
    out = _out_dir(out) if out is not None else None
    try:
        loaded = load_profiles(profiles)
    except ConfigError as exc:
        raise fail(exc) from exc
    fractions = [serving_max_fraction, *extra]
    settings = MixedSettings(
        cluster=ClusterSpec(nodes, gpus_per_node, "H100", 80.0),
        hours=hours,
        warmup_s=warmup,
        batch_load=batch_load,
        workflow_rate_per_s=rate,
        burst_factor=burst,
        burst_s=(burst_start, burst_end),
        seed=seed,
    )
    say = notes(console, errors, output)
    say.print(
        f"simulating {hours:g} h on {settings.cluster.describe()} ({cache_model.value} model "
        "caches) for serving_max_fraction " + ", ".join(f"{f:g}" for f in fractions)
    )
    began = time.perf_counter()
    knobs = {
        "serving_linger_s": serving_linger,
        "serving_lend_s": serving_lend,
        "serving_reserve": serving_reserve,
        "serving_reserve_min": serving_reserve_min,
        "serving_load_window_s": serving_load_window,
        "serving_cache_model": cache_model.value,
    }
    # Each seed's runs and, measured beside them, the baseline: its batch jobs alone.
    chosen = several or [seed]
    count = len(chosen) * (len(fractions) + 1)
    with counting(console, "runs", count) as advance:
        results = run_seeds(
            loaded,
            fractions,
            settings,
            chosen,
            knobs=knobs,
            parallel=parallel,
            on_run=lambda _: advance(1),
        )
    total = time.perf_counter() - began
    if several:
        _show(
            output,
            [(SEEDS_TITLE, *seeds_table(results))],
            fractions=fractions,
            seeds=several,
            cache_model=cache_model.value,
            wall_s=round(total, 3),
        )
        say.print(f"{count} runs in {total:.1f} s")
        if out is not None:
            (out / "seeds.md").write_text(seeds_markdown(results, settings))
            say.print(f"wrote {out / 'seeds.md'}")
        return
    [one] = results
    runs, alone = list(one.runs), one.alone
    shown: list[Shown] = [(title, *rows) for title, rows in tables(runs[0], alone).items()]
    side_by_side = "serving_max_fraction side by side (same workload)"
    shown.append((side_by_side, *table(COMPARISON, runs)))
    _show(output, shown, fractions=fractions, cache_model=cache_model.value, wall_s=round(total, 3))
    say.print(f"{len(runs)} runs in {total:.1f} s")
    if out is not None:
        from libs.sim.plots import write_mixed_plot

        (out / "summary.md").write_text(markdown(runs, settings, alone))
        say.print(f"wrote {out / 'summary.md'}, {write_mixed_plot(runs, out / 'mixed.png')}")
