"""``GET /metrics``: the cluster as the projector's views see it, in Prometheus' format
(``services.metrics_http``; the caller's token is checked by ``access``).

Gauges are set from the views at each scrape, so they say what the views say now:
waiting jobs, owed-now inputs (entitled and demanded GPUs) and delivered GPU-hours per
allocation, GPUs by state. Until the worker is ready the views are partial, and nothing
is set from them (``/ready`` says when).
"""

from __future__ import annotations

import time
from functools import cache

from faust import web

from libs.readmodels.nodes import listed, without_ended_tasks
from libs.readmodels.occupancy import by_cluster
from libs.telemetry.metrics import (
    ALLOCATION_DELIVERED_GPU_HOURS,
    ALLOCATION_DEMAND_GPUS,
    ALLOCATION_ENTITLED_GPUS,
    GPUS,
    GPUS_HELD_ON_LOST_NODES,
    WAITING_JOBS,
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
    """Set the cluster gauges from the views as they are now, counted as the console
    counts them (``libs.readmodels.occupancy``)."""
    job_of = cache(get_job)
    nodes = [without_ended_tasks(node, job_of) for node in all_nodes() if listed(node)]
    samples = by_cluster(time.time(), nodes, records.heads_with_specs())
    for gauge in (*_BY_ALLOCATION, GPUS, GPUS_HELD_ON_LOST_NODES):
        gauge.clear()  # an allocation or cluster gone from the views is gone from here
    for cluster, sample in samples.items():
        for state, count in sample.total.states().items():
            GPUS.labels(cluster, state).set(count)
        GPUS_HELD_ON_LOST_NODES.labels(cluster).set(sample.total.lost_held)
        load = sample.occupancy()
        for allocation in sorted(load.waiting.keys() | load.held.keys() | load.asked.keys()):
            WAITING_JOBS.labels(cluster, allocation).set(load.waiting.get(allocation, 0))
            ALLOCATION_DEMAND_GPUS.labels(cluster, allocation).set(load.demand(allocation))
    for ledger in usage.ledger.clusters():
        live = samples[ledger.cluster].capacity if ledger.cluster in samples else 0
        for balance in ledger.balances().balances:
            labels = (ledger.cluster, balance.allocation)
            ALLOCATION_ENTITLED_GPUS.labels(*labels).set(balance.entitlement * live)
            ALLOCATION_DELIVERED_GPU_HOURS.labels(*labels).set(balance.gpu_seconds / 3600)
