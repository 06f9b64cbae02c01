"""``GET /metrics``: the cluster as the projector's views see it, in Prometheus' format
(``services.metrics_http``; the caller's token is checked by ``access``).

Gauges are set from the views at each scrape, so they say what the views say now:
waiting jobs, owed-now inputs (entitled and demanded GPUs) and delivered GPU-hours per
allocation, GPUs by state. Until the worker is ready the views are partial, and nothing
is set from them (``/ready`` says when).
"""

from __future__ import annotations

from functools import cache

from faust import web

from libs.telemetry.metrics import (
    ALLOCATION_DELIVERED_GPU_HOURS,
    ALLOCATION_DEMAND_GPUS,
    ALLOCATION_ENTITLED_GPUS,
    GPUS,
    GPUS_HELD_ON_LOST_NODES,
    WAITING_JOBS,
    allocation_loads,
    gpu_states,
    live_gpus,
)
from services.metrics_http import METRICS, metrics_response
from services.projector.app import app
from services.projector.jobs.tables import get_job, records
from services.projector.nodes.tables import all_nodes
from services.projector.usage import state as usage

_BY_ALLOCATION = (
    WAITING_JOBS,
    ALLOCATION_DEMAND_GPUS,
    ALLOCATION_ENTITLED_GPUS,
    ALLOCATION_DELIVERED_GPU_HOURS,
)


@app.page(METRICS)
class MetricsView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        if usage.rebuilt.is_set():
            refresh()
        return metrics_response()  # type: ignore[return-value]


def refresh() -> None:
    """Set the cluster gauges from the views as they are now."""
    states = gpu_states(all_nodes(), cache(get_job))
    for gauge in (*_BY_ALLOCATION, GPUS, GPUS_HELD_ON_LOST_NODES):
        gauge.clear()  # an allocation or cluster gone from the views is gone from here
    for cluster, count in states.items():
        for state in ("busy", "idle", "serving", "free", "lost"):
            GPUS.labels(cluster, state).set(getattr(count, state))
        GPUS_HELD_ON_LOST_NODES.labels(cluster).set(count.held_on_lost)
    for (cluster, allocation), load in allocation_loads(records.heads_with_specs()).items():
        WAITING_JOBS.labels(cluster, allocation).set(load.waiting_jobs)
        ALLOCATION_DEMAND_GPUS.labels(cluster, allocation).set(load.demand_gpus)
    gpus = live_gpus(states)
    for ledger in usage.ledger.clusters():
        for balance in ledger.balances().balances:
            labels = (ledger.cluster, balance.allocation)
            ALLOCATION_ENTITLED_GPUS.labels(*labels).set(
                balance.entitlement * gpus.get(ledger.cluster, 0)
            )
            ALLOCATION_DELIVERED_GPU_HOURS.labels(*labels).set(balance.gpu_seconds / 3600)
