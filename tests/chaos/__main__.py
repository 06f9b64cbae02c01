"""``python -m tests.chaos``: one chaos run (``make chaos``); exits 1 if a check fails.

The stack is torn down whatever happens (an error, SIGTERM, Ctrl-C); processes
that outlive the teardown are found by the run's mark, killed, and fail the run.
``--cleanup`` only does the killing, for a run that was itself killed with -9: its
id is in ``OUT/run-id``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import time
from pathlib import Path

from tests.chaos.processes import kill_marked, marked
from tests.chaos.run import PHASES, Run, Settings, drive
from tests.chaos.stack import ChaosStack
from tests.integration.stack import ROOT
from tests.perf.options import add_options, from_options
from tests.perf.stats import console


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    add_options(parser, Settings)
    parser.add_argument(
        "--port-base",
        type=int,
        default=29400,
        help="the broker's port; the controller, admission, budget and "
        "projector take the next four (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / ".local" / "chaos",
        help="results.json, the run's logs and data (default: %(default)s)",
    )
    parser.add_argument(
        "--cleanup", action="store_true", help="only kill what the last run in --out left behind"
    )
    args = parser.parse_args(argv)
    args.settings = from_options(Settings, args)
    if unknown := args.settings.phases - PHASES:
        parser.error(f"--phases: unknown {sorted(unknown)}; known: {sorted(PHASES)}")
    if args.settings.budget_s < 240:
        parser.error("--budget: a run needs at least 240 s")
    return args


def cleanup(out: Path) -> int:
    id_file = out / "run-id"
    if not id_file.exists():
        print(f"no run id in {id_file}: nothing to clean up")
        return 0
    for leftover in kill_marked(id_file.read_text().strip()):
        print(f"killed {leftover}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.cleanup:
        return cleanup(args.out)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Its clients narrate every broker outage; the run's own log says what matters.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    workdir = args.out / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    stack = ChaosStack(workdir, port_base=args.port_base)
    (args.out / "run-id").write_text(stack.run_id + "\n")
    run = Run(stack, args.settings, time.monotonic())
    console.print(
        f"chaos run {stack.run_id}: budget {args.settings.budget_s:g} s, logs in {stack.logs}"
    )
    # SIGTERM (CI's timeout, make interrupted) unwinds like Ctrl-C, through the teardown.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        stack.up()
        run.report.add("stack up", f"{time.monotonic() - run.started:.0f} s", "", None)
        asyncio.run(asyncio.wait_for(drive(run), timeout=run.left() + 60))
    except (Exception, KeyboardInterrupt) as exc:  # the report says what happened
        logging.exception("chaos run stopped early")
        run.report.add("run completed", f"stopped: {type(exc).__name__}: {exc}"[:200], "", False)
    finally:
        stack.down()
        time.sleep(1)  # orphaned tasks of killed agents end or get reparented
        leftovers = kill_marked(stack.run_id)
        run.report.count("processes left after teardown", leftovers)
    wall = time.monotonic() - run.started
    run.report.add("wall time", f"{wall:.0f} s", f"<= {args.settings.budget_s:g} s", None)
    run.report.write(args.out / "results.json")
    run.report.print()
    console.print(
        f"results in {args.out / 'results.json'}; still marked: {len(marked(stack.run_id))}"
    )
    return 1 if run.report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
