"""``python -m tests.perf.bench [core|workflow|live|all] [flags]``: run benchmarks, print numbers.

``make bench`` runs them all. Each benchmark measures a baseline in the same run and
prints medians and ratios against it; nothing is written to disk but scratch logs.
Every figure is then checked against its committed range (tests/perf/ranges.yaml): the
command exits 1 when one is outside it (tests.perf.ranges says how ranges are set).

    python -m tests.perf.bench core --waiting 2000 --inputs 1000
    python -m tests.perf.bench workflow --tasks 4096 --gpus 64 --shapes wide
    python -m tests.perf.bench live --rate 500 --duration 20 --modes echo,placement
    python -m tests.perf.bench live --duration 10 --modes placement --profile placement
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.perf.core_bench import CoreParams, report_core, run_core
from tests.perf.live_bench import LiveParams, run_live
from tests.perf.ranges import Figure, judge, load_ranges, report
from tests.perf.workflow_bench import WorkflowParams, run_workflow


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.perf.bench", description=__doc__)
    parser.add_argument(
        "which", nargs="?", choices=("core", "workflow", "live", "all"), default="all"
    )
    core = parser.add_argument_group("core")
    c = CoreParams()
    core.add_argument("--nodes", type=int, default=c.nodes)
    core.add_argument("--gpus-per-node", type=int, default=c.gpus_per_node)
    core.add_argument("--waiting", type=int, default=c.waiting, help="jobs to queue")
    core.add_argument("--inputs", type=int, default=c.inputs, help="measured inputs, at most")
    core.add_argument("--seed", type=int, default=c.seed)
    core.add_argument("--setup-budget", type=float, default=c.setup_budget_s, metavar="S")
    core.add_argument("--measure-budget", type=float, default=c.measure_budget_s, metavar="S")
    flow = parser.add_argument_group("workflow")
    w = WorkflowParams()
    flow.add_argument("--tasks", type=int, default=w.tasks, help="tasks in the workflow")
    flow.add_argument("--gpus", type=int, default=w.gpus)
    flow.add_argument("--serving-gpus-per-node", type=int, default=w.gpus_per_node)
    flow.add_argument("--shapes", default=",".join(w.shapes), help="wide,layered,chain")
    flow.add_argument("--whole-budget", type=float, default=w.whole_budget_s, metavar="S")
    live = parser.add_argument_group("live")
    lp = LiveParams()
    live.add_argument("--sim-nodes", type=int, default=lp.nodes)
    live.add_argument("--rate", type=float, default=lp.rate, help="submissions per second")
    live.add_argument("--duration", type=float, default=lp.duration_s, metavar="S")
    live.add_argument("--concurrency", type=int, default=lp.concurrency)
    live.add_argument("--job-seconds", type=float, default=lp.job_s, metavar="S")
    live.add_argument("--modes", default=",".join(lp.modes), help="echo,placement")
    live.add_argument("--bootstrap", default=lp.bootstrap)
    live.add_argument(
        "--profile",
        default="",
        choices=("", "placement", "admission", "node_agent"),
        help="run this service under cProfile (skews its latency)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ranges = load_ranges()  # a broken ranges file fails before minutes of measuring
    figures: list[Figure] = []
    if args.which in ("core", "all"):
        figures += report_core(
            run_core(
                CoreParams(
                    nodes=args.nodes,
                    gpus_per_node=args.gpus_per_node,
                    waiting=args.waiting,
                    inputs=args.inputs,
                    seed=args.seed,
                    setup_budget_s=args.setup_budget,
                    measure_budget_s=args.measure_budget,
                )
            )
        )
    if args.which in ("workflow", "all"):
        if args.tasks < 3 or args.gpus < 1 or not 1 <= args.serving_gpus_per_node <= args.gpus:
            raise SystemExit(
                "--tasks must be >= 3 and --serving-gpus-per-node between 1 and --gpus"
            )
        figures += run_workflow(
            WorkflowParams(
                tasks=args.tasks,
                gpus=args.gpus,
                gpus_per_node=args.serving_gpus_per_node,
                shapes=tuple(s.strip() for s in args.shapes.split(",") if s.strip()),
                seed=args.seed,
                whole_budget_s=args.whole_budget,
            )
        )
    if args.which in ("live", "all"):
        modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        unknown = set(modes) - {"echo", "placement"}
        if unknown:
            raise SystemExit(f"--modes: unknown {sorted(unknown)}; use echo and/or placement")
        figures += run_live(
            LiveParams(
                nodes=args.sim_nodes,
                rate=args.rate,
                duration_s=args.duration,
                concurrency=args.concurrency,
                job_s=args.job_seconds,
                modes=modes,
                bootstrap=args.bootstrap,
                profile=args.profile,
            )
        )
    ran = {"core", "workflow", "live"} if args.which == "all" else {args.which}
    judged = args == parse_args([args.which])  # ranges hold for the defaults only
    return 0 if report(judge(figures, ranges, ran), judged=judged) else 1


if __name__ == "__main__":
    raise SystemExit(main())
