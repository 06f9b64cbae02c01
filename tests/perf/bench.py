"""``python -m tests.perf.bench [core|workflow|live|audit|failover|restart|all] [flags]``.

``make bench`` runs them all. Each benchmark measures a baseline in the same run and
prints medians and ratios against it. Every figure is then checked against its
committed range (tests/perf/ranges.yaml): the command exits 1 when one is outside it
(tests.perf.ranges says how ranges are set). The figures, with their ranges and
verdicts, are written to ``bench/results.json`` and printed (``tests.perf.results``).

    python -m tests.perf.bench core --waiting 2000 --inputs 1000
    python -m tests.perf.bench workflow --tasks 4096 --gpus 64 --shapes wide
    python -m tests.perf.bench live --rate 500 --duration 20 --modes echo,placement
    python -m tests.perf.bench live --duration 10 --modes placement --profile placement
    python -m tests.perf.bench failover --after-kill 20
    python -m tests.perf.bench restart --events 1000000
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.perf.audit_bench import AuditParams, run_audit
from tests.perf.core_bench import CoreParams, report_core, run_core
from tests.perf.failover_bench import FailoverParams, run_failover
from tests.perf.live_bench import LiveParams, run_live
from tests.perf.options import add_options, from_options
from tests.perf.ranges import Figure, judge, load_ranges, report
from tests.perf.restart_bench import RestartParams, run_restart
from tests.perf.results import RESULTS_FILE, write_results
from tests.perf.workflow_bench import WorkflowParams, run_workflow

BENCHES = ("core", "workflow", "live", "audit", "failover", "restart")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.perf.bench", description=__doc__)
    parser.add_argument("which", nargs="?", choices=(*BENCHES, "all"), default="all")
    add_options(parser.add_argument_group("core"), CoreParams)
    add_options(parser.add_argument_group("workflow"), WorkflowParams)
    add_options(parser.add_argument_group("live"), LiveParams)
    add_options(parser.add_argument_group("audit"), AuditParams)
    add_options(parser.add_argument_group("failover"), FailoverParams)
    add_options(parser.add_argument_group("restart"), RestartParams)
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
    if args.which in ("audit", "all"):
        figures += run_audit(from_options(AuditParams, args, bootstrap=args.bootstrap))
    if args.which in ("failover", "all"):
        figures += run_failover(from_options(FailoverParams, args, bootstrap=args.bootstrap))
    if args.which in ("restart", "all"):
        figures += run_restart(from_options(RestartParams, args, bootstrap=args.bootstrap))
    ran = set(BENCHES) if args.which == "all" else {args.which}
    judged = args == parse_args([args.which])  # ranges hold for the defaults only
    verdicts = judge(figures, ranges, ran)
    ok = report(verdicts, judged=judged)
    write_results(figures, verdicts, judged=judged)
    print(RESULTS_FILE.read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
