"""A recorded Quartermaster log: length-delimited ``qm.v1.Envelope`` records.

Each record is a base-128 varint byte length followed by the encoded envelope
(protobuf's "delimited" framing). Envelopes become core inputs with the same
``to_input`` the placement service uses. The simulator makes its own task
lifecycle, so the log contributes submissions, cancellations, nodes and the
budget; a job's runtime is its ``simulated_duration_s``, or else the longest
task run the log recorded for it. A job with neither has no run to replay and is left
out, with why (``LeftOut``): still running or still waiting when the log ends,
cancelled before it started, or its tasks ended without starting (a launch that failed)
or as they started.

``excerpt`` cuts such a log out of a live one (``qm export``): a window of real
history to replay under another policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from qm.v1 import events_pb2

from libs.core.budget_tree import BudgetTree
from libs.core.ids import JobId
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    JobArrived,
    NodeJoined,
    TaskEnded,
    TaskStarted,
)
from libs.core.model import NodeSpec
from libs.events import DecodeError, event_type, logfile, occurred_at
from libs.events.convert import to_input
from libs.readmodels import job_key
from libs.sim.traces.raw import TraceError
from libs.sim.workload import LeftOut, SimJob

# Why a recorded job has no run to replay.
STILL_RUNNING = "still running when the log ends"
STILL_WAITING = "still waiting when the log ends"
CANCELLED = "cancelled before it started"
NEVER_STARTED = "its tasks ended without starting"
NO_TIME = "its tasks ended as they started"


@dataclass(frozen=True)
class RecordedLog:
    jobs: tuple[SimJob, ...]
    cancels: tuple[tuple[float, str], ...]
    nodes: tuple[NodeSpec, ...]  # as last registered
    tree: BudgetTree | None  # the last budget set, if any
    left_out: tuple[LeftOut, ...]  # jobs with no runtime to replay, by submission


def read_envelopes(data: bytes) -> Iterator[events_pb2.Envelope]:
    try:
        yield from logfile.read_envelopes(data)
    except DecodeError as exc:
        raise TraceError(str(exc)) from exc


def load_event_log(path: Path) -> RecordedLog:
    arrivals: dict[JobId, JobArrived] = {}
    started: dict[str, float] = {}
    longest: dict[str, float] = {}
    running: dict[str, str] = {}  # task id -> job id, of tasks started and not ended
    ran: set[str] = set()  # jobs a task of which started
    ended: set[str] = set()  # jobs a task of which ended
    cancels: list[tuple[float, str]] = []
    nodes: dict[str, NodeSpec] = {}
    tree: BudgetTree | None = None
    for env in read_envelopes(path.read_bytes()):
        match to_input(env):
            case JobArrived() as arrived:
                arrivals.setdefault(arrived.job_id, arrived)
            case NodeJoined(node=node):
                nodes[node.node_id] = node
            case BudgetSet() as budget:
                tree = budget.tree
            case CancelRequested(at=at, job_id=job_id):
                cancels.append((at, job_id))
            case TaskStarted(at=at, job_id=job_id, task_id=task_id):
                started.setdefault(task_id, at)
                running[task_id] = job_id
                ran.add(job_id)
            case TaskEnded(at=at, job_id=job_id, task_id=task_id):
                ended.add(job_id)
                running.pop(task_id, None)
                if task_id in started:
                    run = at - started[task_id]
                    longest[job_id] = max(longest.get(job_id, 0.0), run)
    jobs: list[SimJob] = []
    left_out: list[LeftOut] = []
    cancelled = {job_id for _, job_id in cancels}
    still_running = set(running.values())
    for job_id, arrived in sorted(arrivals.items(), key=lambda item: item[1].at):
        runtime = arrived.spec.simulated_duration_s or longest.get(job_id, 0.0)
        if runtime > 0:
            jobs.append(SimJob(arrived.at, job_id, arrived.spec, runtime))
            continue
        if job_id in still_running:
            why = STILL_RUNNING
        elif job_id in ran:
            why = NO_TIME
        elif job_id in ended:
            why = NEVER_STARTED
        else:
            why = CANCELLED if job_id in cancelled else STILL_WAITING
        left_out.append(LeftOut(arrived.at, job_id, why))
    return RecordedLog(
        jobs=tuple(jobs),
        cancels=tuple(sorted(cancels)),
        nodes=tuple(nodes[k] for k in sorted(nodes)),
        tree=tree,
        left_out=tuple(left_out),
    )


# What the cluster is at a moment: each node's last registration, the last budget tree.
_STANDING = {"node_registered", "budget_changed"}


class Excerpt:
    """The log of the jobs submitted in [``since``, ``until``), replayable on its own, cut
    as the log is read (``add``), keeping only what it will hold: the cluster as it stood
    at ``since`` (each node's last registration, the last budget tree), every event of
    the window, and the window's jobs' events after it (a run that ends later still has
    its runtime). Events of jobs submitted before the window are left out."""

    def __init__(self, since: float, until: float = math.inf) -> None:
        self.since, self.until = since, until
        self.read = 0
        self._standing: dict[tuple[str, str], events_pb2.Envelope] = {}
        self._kept: list[events_pb2.Envelope] = []
        self._jobs: set[str] = set()

    def add(self, env: events_pb2.Envelope) -> None:
        self.read += 1
        at, kind = occurred_at(env), event_type(env)
        if at < self.since:
            if kind in _STANDING:
                node = env.node_registered.inventory.node_id if kind == "node_registered" else ""
                known = self._standing.get((kind, node))
                if known is None or occurred_at(known) <= at:  # partitions interleave
                    self._standing[kind, node] = env
        elif at < self.until:
            self._kept.append(env)
            if kind == "job_admitted":
                self._jobs.add(env.job_admitted.job_id)
        elif job_key(env) in self._jobs:  # its admission came first, in its partition
            self._kept.append(env)

    def envelopes(self) -> list[events_pb2.Envelope]:
        """In order of time: the standing cluster, then the window's (and its jobs') events."""
        chosen = [
            env
            for env in sorted(self._kept, key=occurred_at)  # stable: a partition's order
            if (job_id := job_key(env)) in self._jobs
            or (job_id is None and occurred_at(env) < self.until)
        ]
        return sorted(self._standing.values(), key=occurred_at) + chosen


def excerpt(
    envelopes: Iterable[events_pb2.Envelope], since: float, until: float = math.inf
) -> list[events_pb2.Envelope]:
    """``Excerpt`` of a log read whole."""
    cut = Excerpt(since, until)
    for env in envelopes:
        cut.add(env)
    return cut.envelopes()
