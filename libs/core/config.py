"""The policy's knobs. Part of the replay contract: auditors must use the same values.

Read from a file by ``libs.config.policy``, which declares each knob's range. Every
decision records :func:`config_digest` of the knobs it was made under, and placement
records the knobs themselves (:func:`knobs`), so that a replay under other knobs can
name the ones that differ (:func:`knob_differences`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

DAY = 86_400.0
HOUR = 3_600.0


@dataclass(frozen=True)
class PolicyConfig:
    lookback_window_s: float = 7 * DAY
    # No contract protects a job longer than this, whatever it asked for.
    max_min_runtime_s: float = 8 * HOUR
    # Running work counts toward its allocation's usage this far ahead, so that
    # a pass that just placed work for an allocation ranks it accordingly.
    running_horizon_s: float = HOUR
    # Whether a minimum runtime also protects charged work started beyond its
    # allocation's entitlement (on borrowed GPUs: libs/core/contract.py). Off, a team
    # below its share reclaims borrowed GPUs at once, as a quota's borrowed capacity is
    # reclaimed; on, it waits for the contract to end (up to max_min_runtime_s).
    protect_borrowed: bool = False
    # Debug work starts fast because this share of GPUs is kept free or under
    # free work (which debug work preempts at once): other allocated work may
    # not eat into it.
    debug_headroom: float = 0.05
    # Free work is preemptible at any moment: stopped for someone else, it gets this
    # long between SIGTERM and SIGKILL (at most the node agent's own grace), so that
    # debug work taking the headroom above starts in seconds, not a full grace.
    free_stop_grace_s: float = 5.0
    # What one GPU-second costs, by GPU type (types not listed cost 1.0): usage
    # and so fair share are counted in these units.
    gpu_prices: tuple[tuple[str, float], ...] = ()
    # Workflow serving (libs.core.compass). Planner: compass, heft, hash or jit.
    serving_mode: str = "compass"
    # How the workers' model caches make room, as the planner counts it: lookahead
    # (the node agent's: furthest next use first, free) or fifo-cost (first loaded
    # first, each eviction costing its transfer: the Compass paper's simulator). Say
    # what the node agents do (their --cache-model): the planner counts on it, and a
    # node whose agent registers another model is refused.
    serving_cache_model: str = "lookahead"
    # A ready task leaves its planned GPU when the wait there exceeds this × its
    # run time; join tasks (several parents) are adjusted only if adjust_joins.
    adjust_threshold: float = 1.5
    adjust_joins: bool = True
    # compass sends each task with a wait limit: the wait it expects at the GPU plus
    # this × the task's run time. A GPU that would keep it waiting longer refuses it
    # (TaskRefused) and the planner sends it elsewhere (at most MAX_REFUSALS times):
    # the GPU knows at once what its planner learns late, another planner's sends
    # above all. 0: no limit.
    refuse_margin: float = 0.2
    # compass holds a new workflow in the scheduler's queue while a plan would keep
    # its first task waiting longer than this × the workflow's best-case time: under
    # overload, tasks of workflows already under way then meet short GPU queues
    # instead of queueing behind new ones. 0: never hold (and plan in arrival order).
    hold_threshold: float = 0.75
    # The held queue goes earliest due first, due = arrival + this × best case: a
    # short workflow passes a long one that arrived less than this × the difference
    # of their best cases before it (most workflows are short: the median slowdown
    # falls), and none is passed by one arriving later than that. 0: oldest first.
    due_slack: float = 30.0
    # Under overload compass also keeps the workflows with the most work waiting (they
    # lose the least slowdown for the GPU time they free): one waits while it and the
    # workflows that arrived no larger (other planners' too) bring more work (GPU run
    # time) than admit_load × the GPUs of its type run, over arrival_window_s; or while
    # admitting it would take the work this planner admitted past its share (its part
    # of the work that arrived) of what those GPUs run over admit_window_s; and till its due time
    # at the most (libs/core/compass/load.py). 0: no such limit (nor with hold_threshold 0).
    admit_load: float = 0.95
    arrival_window_s: float = 4.0
    admit_window_s: float = 1.0
    # This planner's name when several share the GPUs (each plans a share of the
    # workflows): GPUs that tie go to each in its own order, not all to the same one
    # (libs/core/compass/order.py). Empty: one planner, lowest id first.
    serving_planner: str = ""
    # Loading a model costs size ÷ this (PCIe, MB/ms); outputs cross nodes at the other.
    host_to_gpu_mb_per_ms: float = 10.171
    node_to_node_mb_per_ms: float = 12.583
    # The most of the cluster's GPUs that workflows may hold at once; the rest
    # stays with batch work whatever the serving load.
    serving_max_fraction: float = 0.5
    # Serving keeps a warm reserve of idle GPUs for the next arrivals: enough that the
    # pool holds its load (the mean of its busy GPUs over serving_load_window_s) plus
    # serving_reserve × the load's square root, at least serving_reserve_min idle. Plans
    # use the busy GPUs and the reserve (those drained most recently); other idle GPUs
    # go back to batch work serving_lend_s (0: at once) after their queue drained, so the
    # pool shrinks with its load, and every idle one goes back after serving_linger_s. Under
    # budget pressure a waiting job may take the reserve's idle GPUs but
    # serving_reserve_min (serving's contract).
    serving_reserve: float = 2.0
    serving_reserve_min: int = 2
    serving_load_window_s: float = 30.0
    serving_lend_s: float = 0.0
    serving_linger_s: float = 30.0
    # A node that heartbeats is declared lost once it has been silent this long (on
    # the log's clock): its tasks end LOST or requeue, its GPUs leave the pool.
    node_lost_timeout_s: float = 30.0
    # A job spanning nodes gets a rendezvous port (MASTER_PORT) on its rank 0's node:
    # the lowest of rendezvous_ports from rendezvous_port that no other gang there holds.
    # The longest warning (JobSpec.warning_s) a job gets before it is stopped: a
    # preemption's GPUs free that much later.
    max_stop_warning_s: float = 300.0
    rendezvous_port: int = 29500
    rendezvous_ports: int = 100

    def price(self, gpu_type: str) -> float:
        return dict(self.gpu_prices).get(gpu_type, 1.0)


def knobs(config: PolicyConfig) -> dict[str, str]:
    """Every knob by name, its value as canonical JSON: what the log records of a config."""
    return {f.name: _canonical(getattr(config, f.name)) for f in dataclasses.fields(config)}


@lru_cache(maxsize=16)  # computed for every input that decides; configs are few
def config_digest(config: PolicyConfig) -> bytes:
    """16 bytes of sha256 over the knobs: equal for equal knobs, whoever computes it."""
    return hashlib.sha256(_dumps(knobs(config)).encode()).digest()[:16]


@dataclass(frozen=True)
class KnobDifference:
    name: str
    theirs: str | None  # None: they have no such knob
    mine: str | None

    def describe(self, theirs: str, mine: str) -> str:
        """E.g. ``lookback_window_s: log 604800.0, replay 86400.0``."""
        return f"{self.name}: {theirs} {self.theirs or '(none)'}, {mine} {self.mine or '(none)'}"


def knob_differences(
    theirs: Mapping[str, str], config: PolicyConfig, names: Collection[str] = ()
) -> tuple[KnobDifference, ...]:
    """The knobs (of ``names``; all if empty) whose recorded value is not ``config``'s, by name."""
    mine = knobs(config)
    wanted = set(names) or theirs.keys() | mine.keys()
    return tuple(
        KnobDifference(name, theirs.get(name), mine.get(name))
        for name in sorted(wanted)
        if theirs.get(name) != mine.get(name)
    )


def _canonical(value: object) -> str:
    return _dumps(_floats(value))


def _floats(value: object) -> object:
    # 3600 and 3600.0 are the same knob value: ints (no knob is one) are written as floats.
    if isinstance(value, tuple | list):
        return [_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
