"""The policy's knobs. Part of the replay contract: auditors must use the same values.

Read from a file by ``libs.config.policy``, which declares each knob's range.
"""

from __future__ import annotations

from dataclasses import dataclass

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
