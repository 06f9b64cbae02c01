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
from tests.perf.options import add_options, from_options
from tests.perf.ranges import Figure, judge, load_ranges, report
from tests.perf.workflow_bench import WorkflowParams, run_workflow


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.perf.bench", description=__doc__)
    parser.add_argument(
        "which", nargs="?", choices=("core", "workflow", "live", "all"), default="all"
    )
    add_options(parser.add_argument_group("core"), CoreParams)
    add_options(parser.add_argument_group("workflow"), WorkflowParams)
    add_options(parser.add_argument_group("live"), LiveParams)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ranges = load_ranges()  # a broken ranges file fails before minutes of measuring
    figures: list[Figure] = []
    if args.which in ("core", "all"):
        figures += report_core(run_core(from_options(CoreParams, args)))
    if args.which in ("workflow", "all"):
        if args.tasks < 3 or args.gpus < 1 or not 1 <= args.serving_gpus_per_node <= args.gpus:
            raise SystemExit(
                "--tasks must be >= 3 and --serving-gpus-per-node between 1 and --gpus"
            )
        figures += run_workflow(from_options(WorkflowParams, args, seed=args.seed))
    if args.which in ("live", "all"):
        live = from_options(LiveParams, args)
        unknown = set(live.modes) - {"echo", "placement"}
        if unknown:
            raise SystemExit(f"--modes: unknown {sorted(unknown)}; use echo and/or placement")
        figures += run_live(live)
    ran = {"core", "workflow", "live"} if args.which == "all" else {args.which}
    judged = args == parse_args([args.which])  # ranges hold for the defaults only
    return 0 if report(judge(figures, ranges, ran), judged=judged) else 1


if __name__ == "__main__":
    raise SystemExit(main())
