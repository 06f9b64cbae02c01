"""The policy's knobs. Part of the replay contract: auditors must use the same values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

DAY = 86_400.0
HOUR = 3_600.0
SERVING_MODES = ("compass", "heft", "hash", "jit")
NON_NEGATIVE = ("adjust_threshold", "hold_threshold")
POSITIVE = ("node_lost_timeout_s",)


@dataclass(frozen=True)
class PolicyConfig:
    lookback_window_s: float = 7 * DAY
    # No contract protects a job longer than this, whatever it asked for.
    max_min_runtime_s: float = 8 * HOUR
    # Running work counts toward its allocation's usage this far ahead, so that
    # a pass that just placed work for an allocation ranks it accordingly.
    running_horizon_s: float = HOUR
    # Debug work starts fast because this share of GPUs is kept free or under
    # free work (which debug work preempts at once): other allocated work may
    # not eat into it.
    debug_headroom: float = 0.05
    # What one GPU-second costs, by GPU type (types not listed cost 1.0): usage
    # and so fair share are counted in these units.
    gpu_prices: tuple[tuple[str, float], ...] = ()
    # Workflow serving (libs.core.compass). Planner: compass, heft, hash or jit.
    serving_mode: str = "compass"
    # A ready task leaves its planned GPU when the wait there exceeds this × its
    # run time; join tasks (several parents) are adjusted only if adjust_joins.
    adjust_threshold: float = 1.5
    adjust_joins: bool = True
    # compass holds a new workflow in the scheduler's queue (oldest first) while
    # a plan would keep its first task waiting longer than this × the workflow's
    # best-case time: under overload, tasks of workflows already under way then
    # meet short GPU queues instead of queueing behind new ones. 0: never hold.
    hold_threshold: float = 3.0
    # Loading a model costs size ÷ this (PCIe, MB/ms); outputs cross nodes at the other.
    host_to_gpu_mb_per_ms: float = 10.171
    node_to_node_mb_per_ms: float = 12.583
    # The most of the cluster's GPUs that workflows may hold at once; the rest
    # stays with batch work whatever the serving load.
    serving_max_fraction: float = 0.5
    # A serving GPU whose queue drained goes back to batch work after this long,
    # so a steady stream of workflows keeps its GPUs and their warm models.
    serving_linger_s: float = 30.0
    # A node that heartbeats is declared lost once it has been silent this long (on
    # the log's clock): its tasks end LOST or requeue, its GPUs leave the pool.
    node_lost_timeout_s: float = 30.0

    def price(self, gpu_type: str) -> float:
        return dict(self.gpu_prices).get(gpu_type, 1.0)


def policy_from_mapping(raw: Mapping[str, Any]) -> PolicyConfig:
    """Knobs from a parsed YAML/JSON mapping; unknown keys are an error, not a typo lost."""
    known = {f.name: f.type for f in fields(PolicyConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(
            f"unknown policy setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {name: _value(name, value) for name, value in raw.items()}
    return replace(PolicyConfig(), **values)


def _value(name: str, value: Any) -> Any:
    if name == "gpu_prices":
        return _prices(value)
    if name == "serving_mode":
        if value not in SERVING_MODES:
            raise ValueError(f"serving_mode: {value!r} is not one of {', '.join(SERVING_MODES)}")
        return str(value)
    if name == "adjust_joins":
        if not isinstance(value, bool):
            raise ValueError(f"adjust_joins: {value!r} must be true or false")
        return value
    number = float(value)
    if name in NON_NEGATIVE and not number >= 0:
        raise ValueError(f"{name}: {value!r} must be a number >= 0")
    if name in POSITIVE and not number > 0:
        raise ValueError(f"{name}: {value!r} must be a number > 0")
    return number


def _prices(raw: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    prices = tuple(sorted((str(t), float(p)) for t, p in dict(raw).items()))
    bad = [t for t, p in prices if not p > 0]
    if bad:
        raise ValueError(f"gpu_prices: the price of {bad[0]!r} must be > 0")
    return prices
