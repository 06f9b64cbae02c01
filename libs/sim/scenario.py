"""Scenarios: which trace, which part of it, on which cluster, under which budget.

A scenario file (``deploy/sim/*.yaml``) names a trace and its defaults; it is read by
``libs.sim.scenario_file``. Command-line knobs replace single fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar, get_args

from libs.config.budget import load_budget_tree
from libs.sim.cluster import ClusterSpec
from libs.sim.mapping import ContractRules, Teams, to_sim_jobs
from libs.sim.traces import (
    load_csv,
    load_event_log,
    parse_alibaba,
    parse_csv_trace,
    parse_dirlab,
    select,
)
from libs.sim.traces.raw import J, RawJob, TraceError
from libs.sim.workload import LeftOut, SimJob, Workload

Trace = Literal["philly", "alibaba", "bluewaters", "theta", "csv", "eventlog"]
TRACES: tuple[Trace, ...] = get_args(Trace)
T = TypeVar("T")

# Every trace but a recorded log, by its parser.
PARSERS: dict[Trace, Callable[[Iterable[str]], list[RawJob]]] = {
    "philly": partial(parse_dirlab, prefix="philly"),
    "alibaba": parse_alibaba,
    "bluewaters": partial(parse_dirlab, prefix="bluewaters"),
    # Theta's KNL nodes have no GPUs: one node stands for one GPU (deploy/sim/theta.yaml).
    "theta": partial(parse_dirlab, prefix="theta", gpus_column="node_num"),
    "csv": parse_csv_trace,
}


@dataclass(frozen=True)
class Targets:
    """What a run of a scenario's class of workload is judged by, the same defaults for
    every policy: the worst team (owed at or above the floor, ``service_level.headline``)
    and the weighted figure, in percent of owed; occupancy (None: not judged, for a load
    that cannot fill the cluster); the debug work's p90 wait; the work preemption threw
    away, in percent of capacity; the start rate of every size class that fits, against
    the single-GPU jobs'; and the simulator's CPU time."""

    worst_team_pct: float = 95.0
    weighted_pct: float = 98.0
    occupancy_pct: float | None = 95.0
    debug_p90_s: float = 10.0
    lost_pct: float = 2.0
    size_rate: float = 0.5
    sim_cpu_s: float = 10.0


@dataclass(frozen=True)
class Scenario:
    trace: Trace
    path: Path
    label: str = ""  # what the report calls the trace; the trace's name when empty
    # None for a recorded log: its own budget tree and nodes, unless set.
    tree_path: Path | None = None
    cluster: ClusterSpec | None = None
    rules: ContractRules = field(default_factory=ContractRules)
    skip_head: int = 0
    start_s: float | None = None  # submissions in [start_s, end_s), trace time
    end_s: float | None = None
    warmup_s: float = 0.0  # see SimSettings
    targets: Targets = field(default_factory=Targets)


def build_workload(scenario: Scenario, max_min_runtime_s: float) -> Workload:
    """The jobs, nodes and budget to simulate; ``max_min_runtime_s`` caps contracts."""
    if scenario.trace == "eventlog":
        log = _read(scenario.path, load_event_log)
        tree = load_budget_tree(scenario.tree_path) if scenario.tree_path else log.tree
        nodes = scenario.cluster.node_specs() if scenario.cluster else log.nodes
        if tree is None or not nodes:
            raise TraceError(f"{scenario.path}: the log sets no budget or nodes; give them")
        # Every submission counts for the window (--skip-head too), replayed or not.
        submitted: list[SimJob | LeftOut] = sorted((*log.jobs, *log.left_out), key=lambda a: a.at)
        arrivals = _window(submitted, scenario)
        jobs = [a for a in arrivals if isinstance(a, SimJob)]
        known = {job.job_id for job in jobs}
        cancels = tuple(c for c in log.cancels if c[1] in known)
        left_out = tuple(a for a in arrivals if isinstance(a, LeftOut))
        return Workload(tuple(jobs), tuple(nodes), tree, cancels, left_out=left_out)
    if scenario.tree_path is None or scenario.cluster is None:
        raise TraceError(f"the {scenario.trace} trace needs a budget tree and a cluster")
    tree = load_budget_tree(scenario.tree_path)
    raw_jobs = _window(
        _read(scenario.path, partial(load_csv, parse=PARSERS[scenario.trace])), scenario
    )
    teams = Teams.of(tree)
    jobs = to_sim_jobs(raw_jobs, teams, scenario.rules, max_min_runtime_s)
    hashed = frozenset(job.job_id for job in raw_jobs if teams.named(job) is None)
    return Workload(tuple(jobs), scenario.cluster.node_specs(), tree, hashed=hashed)


def _read(path: Path, loader: Callable[[Path], T]) -> T:
    """A trace file through its loader; whatever is wrong with it, the error names it."""
    try:
        return loader(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    except (TraceError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from None


def _window(jobs: Sequence[J], scenario: Scenario) -> list[J]:
    return select(
        jobs, skip_head=scenario.skip_head, start_s=scenario.start_s, end_s=scenario.end_s
    )
