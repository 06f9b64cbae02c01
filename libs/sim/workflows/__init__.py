"""Workflow serving simulation: the four Compass workflows through the scheduling core.

The sweep drives the same code as the live stack: a ``Scheduler`` (its
serving core, libs.core.compass.serving, plans each workflow on arrival and
sends each task to its GPU when its inputs are ready, adjusting on the way)
and the simulated cluster (``libs.sim.world``: one ``GpuWorker`` per GPU, its
queue and model cache, reporting loads, evictions, starts and ends as the node
agent does), in milliseconds. The cluster is the Compass setup: one node per
GPU, every GPU empty at the start. Jobs (one workflow each, drawn in equal
shares) arrive by a Poisson or a bursty gamma process.

Models are cached per workflow by default, as the source simulator keys them
(OPT in translation and OPT in question_answer are separate entries);
``share_models`` caches them by name. Deterministic: a seeded generator, and
events at equal times in the order they were made.

The package's modules: ``profiles`` (the workflows and costs), ``serving_cluster`` (the
planners over the simulated cluster, one run), ``sweep_runner`` (the runs of a sweep, side by
side), ``claims`` (what it shows of the paper's claims) and ``report`` (its tables).
"""

from libs.sim.workflows.claims import Claim, claims, over_seeds
from libs.sim.workflows.profiles import PROFILES, Profiles, keyed, load_profiles
from libs.sim.workflows.report import SPREAD_HEADER, Spread, markdown, spreads, tables
from libs.sim.workflows.serving_cluster import (
    ServingCluster,
    WorkflowRun,
    hit_rate,
    hits,
    policy,
    serving_policy,
    simulate,
)
from libs.sim.workflows.sweep_runner import ARRIVALS, Case, SweepRun, run_label, sweep

__all__ = [
    "ARRIVALS",
    "PROFILES",
    "SPREAD_HEADER",
    "Case",
    "Claim",
    "Profiles",
    "ServingCluster",
    "Spread",
    "SweepRun",
    "WorkflowRun",
    "claims",
    "hit_rate",
    "hits",
    "keyed",
    "load_profiles",
    "markdown",
    "over_seeds",
    "policy",
    "run_label",
    "serving_policy",
    "simulate",
    "spreads",
    "sweep",
    "tables",
]
