"""What the console shows one user: a JSON-ready picture of the cluster, pure.

Cluster-wide aggregates (occupancy by GPU type, nodes and their GPU counts) are
everyone's; jobs (waiting, running, recently ended, workflows) and allocations are cut to
the user's ``Scope`` (None: everything, for operators and the root's managers), the rule
admission applies to ``ListJobs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from qm.v1 import types_pb2

from libs.core.service_level import (
    SMALL_TEAM_OWED_FRACTION,
    TARGET_DELIVERED_PCT,
    small_team,
    workflow_slowdown,
)
from libs.events.convert import workflow_from_proto
from libs.readmodels.job_state import WAITING
from libs.readmodels.jobs import Scope
from libs.readmodels.occupancy import Gpus, Timeline, holdings, moment

_S = types_pb2.JobState
Json = dict[str, Any]
RUNNING = frozenset({_S.JOB_STATE_PLACED, _S.JOB_STATE_RUNNING})
ENDED = frozenset(
    {
        _S.JOB_STATE_REJECTED,
        _S.JOB_STATE_FINISHED,
        _S.JOB_STATE_FAILED,
        _S.JOB_STATE_CANCELLED,
        _S.JOB_STATE_PREEMPTED,
        _S.JOB_STATE_LOST,
        _S.JOB_STATE_TIMEOUT,
    }
)
ENDED_SHOWN = 50  # the most recently ended jobs listed
_RUNS = {types_pb2.EXECUTOR_SIMULATED: "simulated"}  # anything else runs processes


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
    nodes = list(nodes)
    shown = [job for job in jobs if scope is None or scope.admits(job)]
    batch = [job for job in shown if not job.spec.HasField("workflow")]
    return {
        "user": user,
        "sees_all": scope is None,
        "now": now,
        "occupancy": _occupancy(timeline, nodes),
        "nodes": _nodes(nodes, {job.job_id: job for job in jobs}),
        **_allocations(timeline, entitlements, scope),
        "target_pct": TARGET_DELIVERED_PCT,
        "window_s": timeline.window_s,
        "span_s": timeline.span_s,
        "waiting": _waiting(shown, now),
        "running": _running(batch, now),
        "ended": _ended(batch),
        "workflows": _workflows(shown, now),
    }


def _occupancy(timeline: Timeline, nodes: list[types_pb2.Node]) -> Json:
    """The latest figures, in all and by GPU type, and each type's series over time; each
    type says how its nodes run tasks (processes, or simulated)."""
    points = timeline.points()
    latest = points[-1].by_type if points else {}
    # The types nodes had (history may count a job of a node since gone under no type).
    types = sorted(
        {t for p in points for t, gpus in p.by_type.items() if gpus.capacity or gpus.lost}
    )
    return {
        "at": [p.at for p in points],
        "now": _figures(points[-1].total if points else Gpus()),
        "types": [
            {
                "gpu_type": gpu_type,
                "runs": _runs(n for n in nodes if _types(n) == [gpu_type]),
                "now": _figures(latest.get(gpu_type, Gpus())),
                "capacity": [p.by_type.get(gpu_type, Gpus()).capacity for p in points],
                "busy": [p.by_type.get(gpu_type, Gpus()).busy for p in points],
                "idle": [p.by_type.get(gpu_type, Gpus()).idle for p in points],
            }
            for gpu_type in types
        ],
    }


def _figures(gpus: Gpus) -> Json:
    return {"capacity": gpus.capacity, "busy": gpus.busy, "idle": gpus.idle, "lost": gpus.lost}


def _types(node: types_pb2.Node) -> list[str]:
    return sorted({gpu.type for gpu in node.inventory.gpus})


def _runs(nodes: Iterable[types_pb2.Node]) -> str:
    """How these nodes run tasks, in words."""
    return ", ".join(sorted({_RUNS.get(n.inventory.executor, "processes") for n in nodes}))


def _nodes(nodes: Iterable[types_pb2.Node], jobs: Mapping[str, types_pb2.Job]) -> list[Json]:
    listed = []
    for node in nodes:
        held = list(holdings(node, jobs))  # as the occupancy counts them
        busy, idle = sum(h.gpus for h in held), sum(h.idle for h in held)
        listed.append(
            {
                "node_id": node.inventory.node_id,
                "gpu_type": ", ".join(_types(node)),
                "runs": _runs([node]),
                "workflows_only": node.inventory.workflows_only,
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
) -> Json:
    """The allocations in ``scope`` (``allocations``), and the service-level headline over
    them (``headline``), as metrics.json names it."""
    shown = {
        name: account
        for name, account in timeline.accounts().items()
        if scope is None or name in scope.allocations
    }
    capacity = timeline.capacity_gpu_s
    h = timeline.headline(shown.values())
    return {
        "allocations": [
            {
                "allocation": name,
                "entitlement": entitlements.get(name, 0.0),
                "owed_gpu_s": account.owed,
                "delivered_gpu_s": account.delivered,
                "free_gpu_s": account.free,
                "delivered_pct": account.delivered_pct,
                "small": small_team(account.owed, capacity),
            }
            for name, account in shown.items()
        ],
        "headline": {
            "owed_delivered_min_pct": h.min_pct,
            "owed_delivered_weighted_pct": h.weighted_pct,
            "owed_small_teams": dataclasses.asdict(h.small_teams),
            "small_team_owed_pct": 100 * SMALL_TEAM_OWED_FRACTION,
        },
    }


def _waiting(jobs: Iterable[types_pb2.Job], now: float) -> list[Json]:
    waiting = sorted(
        (job for job in jobs if job.state in WAITING),
        key=lambda job: (moment(job.submitted_at) or now, job.job_id),
    )
    return [
        _job(job)
        | {
            "reason": job.reason,
            "waited_s": now - submitted if (submitted := moment(job.submitted_at)) else None,
            # Filled in per user from admission's explainer (services/console/starts.py):
            # placement estimates a start only for a job with the nodes that free soonest earmarked.
            "estimated_start": None,
        }
        for job in waiting
    ]


def _running(jobs: Iterable[types_pb2.Job], now: float) -> list[Json]:
    """Jobs placed or running, the latest started first."""
    running = sorted(
        (job for job in jobs if job.state in RUNNING),
        key=lambda job: (-(moment(job.started_at) or now), job.job_id),
    )
    listed = []
    for job in running:
        started = moment(job.started_at)
        listed.append(
            _job(job)
            | {
                "nodes": _nodes_of(job),
                "attempt": job.attempts,
                "started_at": started,
                "ran_s": now - started if started else None,
                "idle": job.idle,
            }
        )
    return listed


def _ended(jobs: Iterable[types_pb2.Job]) -> list[Json]:
    """The ``ENDED_SHOWN`` jobs that ended last, the latest first: how each ended (its
    exit code where its command ran to an end, else why it stopped) and when."""
    ended = sorted(
        (job for job in jobs if job.state in ENDED),
        key=lambda job: (-(moment(job.finished_at) or moment(job.submitted_at) or 0), job.job_id),
    )[:ENDED_SHOWN]
    listed = []
    for job in ended:
        started, finished = moment(job.started_at), moment(job.finished_at)
        # A failure without an exit code of its own (it could not start, its node was
        # lost...) is told by its reason alone.
        exited = job.state == _S.JOB_STATE_FINISHED or (
            job.state == _S.JOB_STATE_FAILED and job.exit_code != 0
        )
        listed.append(
            _job(job)
            | {
                "exit_code": job.exit_code if exited else None,
                "reason": job.reason or job.stop_reason,
                "submitted_at": moment(job.submitted_at),
                "started_at": started,
                "finished_at": finished,
                "ran_s": finished - started if started and finished else None,
            }
        )
    return listed


def _nodes_of(job: types_pb2.Job) -> list[str]:
    """Where a batch job's latest placement runs: one node, or each of a gang's."""
    return sorted({p.node_id for p in job.placements} or ({job.node_id} if job.node_id else set()))


def _job(job: types_pb2.Job) -> Json:
    """What every job list shows of a job."""
    return {
        "job_id": job.job_id,
        "user": job.spec.user,
        "allocation": job.spec.allocation,
        "gpus": job.spec.gpus,
        "gpu_type": job.spec.gpu_type,
        "state": _state(job.state),
    }


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
