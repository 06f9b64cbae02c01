"""What the console shows one user: a JSON-ready picture of the cluster, pure.

Cluster-wide aggregates (occupancy, nodes and their GPU counts) are everyone's; jobs
and allocations are cut to the user's ``Scope`` (None: everything, for operators and
the root's managers), the rule admission applies to ``ListJobs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from qm.v1 import types_pb2

from libs.core.service_level import TARGET_DELIVERED_PCT, workflow_slowdown
from libs.events.convert import workflow_from_proto
from libs.readmodels.jobs import Scope
from libs.readmodels.occupancy import WAITING, Timeline, holdings, moment

_S = types_pb2.JobState
Json = dict[str, Any]


def dashboard(
    *,
    user: str,
    scope: Scope | None,
    now: float,
    timeline: Timeline,
    nodes: Iterable[types_pb2.Node],
    jobs: Iterable[types_pb2.Job],
    entitlements: Mapping[str, float],
) -> Json:
    """The whole page's data as of ``now`` (seconds since the epoch)."""
    shown = [job for job in jobs if scope is None or scope.admits(job)]
    return {
        "user": user,
        "sees_all": scope is None,
        "now": now,
        "occupancy": _occupancy(timeline),
        "nodes": _nodes(nodes, {job.job_id: job for job in jobs}),
        "allocations": _allocations(timeline, entitlements, scope),
        "target_pct": TARGET_DELIVERED_PCT,
        "window_s": timeline.window_s,
        "span_s": timeline.span_s,
        "waiting": _waiting(shown, now),
        "workflows": _workflows(shown, now),
    }


def _occupancy(timeline: Timeline) -> Json:
    points = timeline.points()
    latest = points[-1] if points else None
    return {
        "at": [p.at for p in points],
        "busy": [p.busy for p in points],
        "idle": [p.idle for p in points],
        "capacity": [p.capacity for p in points],
        "now": {
            "capacity": latest.capacity if latest else 0,
            "busy": latest.busy if latest else 0,
            "idle": latest.idle if latest else 0,
            "lost": latest.lost if latest else 0,
        },
    }


def _nodes(nodes: Iterable[types_pb2.Node], jobs: Mapping[str, types_pb2.Job]) -> list[Json]:
    listed = []
    for node in nodes:
        held = list(holdings(node, jobs))  # as the occupancy counts them
        busy, idle = sum(h.gpus for h in held), sum(h.idle for h in held)
        types = sorted({gpu.type for gpu in node.inventory.gpus})
        listed.append(
            {
                "node_id": node.inventory.node_id,
                "gpu_type": ", ".join(types),
                "gpus": len(node.inventory.gpus),
                "busy": 0 if node.lost else busy,
                "idle": 0 if node.lost else idle,
                "lost": node.lost,
                "lost_reason": node.lost_reason,
            }
        )
    return listed


def _allocations(
    timeline: Timeline, entitlements: Mapping[str, float], scope: Scope | None
) -> list[Json]:
    return [
        {
            "allocation": name,
            "entitlement": entitlements.get(name, 0.0),
            "owed_gpu_s": account.owed,
            "delivered_gpu_s": account.delivered,
            "free_gpu_s": account.free,
            "delivered_pct": account.delivered_pct,
        }
        for name, account in timeline.accounts().items()
        if scope is None or name in scope.allocations
    ]


def _waiting(jobs: Iterable[types_pb2.Job], now: float) -> list[Json]:
    waiting = sorted(
        (job for job in jobs if job.state in WAITING),
        key=lambda job: (moment(job.submitted_at) or now, job.job_id),
    )
    return [
        {
            "job_id": job.job_id,
            "user": job.spec.user,
            "allocation": job.spec.allocation,
            "gpus": job.spec.gpus,
            "gpu_type": job.spec.gpu_type,
            "state": _state(job.state),
            "reason": job.reason,
            "waited_s": now - submitted if (submitted := moment(job.submitted_at)) else None,
            # Filled in per user from admission's explainer (services/console/starts.py):
            # placement estimates a start only for a job holding the nodes that free soonest.
            "estimated_start": None,
        }
        for job in waiting
    ]


def _workflows(jobs: Iterable[types_pb2.Job], now: float) -> list[Json]:
    flows = []
    for job in jobs:
        if not job.spec.HasField("workflow"):
            continue
        submitted = moment(job.submitted_at)
        finished = moment(job.finished_at)
        elapsed = ((finished or now) - submitted) if submitted else None
        workflow = workflow_from_proto(job.spec.workflow)
        best_ms = workflow.best_case_ms if workflow is not None else 0.0
        done = sum(task.state == _S.JOB_STATE_FINISHED for task in job.tasks)
        flows.append(
            {
                "job_id": job.job_id,
                "user": job.spec.user,
                "allocation": job.spec.allocation,
                "state": _state(job.state),
                "tasks": len(job.spec.workflow.tasks),
                "tasks_done": done,
                "elapsed_s": elapsed,
                # Against its best case, as Compass measures it (submission to end).
                "slowdown": (
                    workflow_slowdown(elapsed * 1000, best_ms) if elapsed and best_ms > 0 else None
                ),
            }
        )
    return flows


def _state(state: types_pb2.JobState.ValueType) -> str:
    return _S.Name(state).removeprefix("JOB_STATE_").lower()
