"""The scheduler as a deterministic state machine.

``handle`` folds one input into the state and returns the decisions it causes.
The placement service, the simulator and the audit replayer all drive this
class, so replaying the same inputs yields the same decisions and digests.
Iteration follows insertion order (the input order) or sorted keys, never
hash order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from libs.core.decisions import Cancel, Decision, Place, Stop, StopCause, Wait
from libs.core.inputs import CancelRequested, Input, JobArrived, NodeJoined, TaskEnded
from libs.core.model import JobSpec, NodeSpec
from libs.core.placement import Fit, first_fit

POLICY = "first-fit"
POLICY_VERSION = 1


@dataclass(frozen=True)
class _Running:
    task_id: str
    node_id: str
    gpu_indices: tuple[int, ...]


class Scheduler:
    def __init__(self) -> None:
        self.now = 0.0
        self._nodes: dict[str, NodeSpec] = {}
        self._free: dict[str, tuple[int, ...]] = {}
        self._queue: dict[str, JobSpec] = {}  # arrival order
        self._running: dict[str, _Running] = {}
        self._stopping: set[str] = set()
        self._reasons: dict[str, str] = {}
        self._seen: set[str] = set()

    def handle(self, event: Input) -> list[Decision]:
        self.now = max(self.now, event.at)
        match event:
            case JobArrived():
                if event.job_id in self._seen:  # a duplicate submission: already decided
                    return []
                self._seen.add(event.job_id)
                self._queue[event.job_id] = event.spec
            case NodeJoined():
                self._join(event.node)
            case TaskEnded():
                self._end(event)
            case CancelRequested():
                return self._cancel(event.job_id)
        return self._schedule()

    def reason(self, job_id: str) -> str | None:
        """Why a queued job waits, as last decided."""
        return self._reasons.get(job_id)

    def digest(self) -> bytes:
        """A fingerprint of the whole state, recorded with every decision."""
        h = hashlib.sha256()
        for node_id in sorted(self._nodes):
            node = self._nodes[node_id]
            h.update(
                f"n|{node_id}|{node.gpu_type}|{node.gpu_indices}|{self._free[node_id]}\n".encode()
            )
        for job_id in self._queue:
            h.update(f"q|{job_id}\n".encode())
        for job_id in sorted(self._running):
            run = self._running[job_id]
            h.update(f"r|{job_id}|{run.task_id}|{run.node_id}|{run.gpu_indices}\n".encode())
        return h.digest()

    def _join(self, node: NodeSpec) -> None:
        if self._nodes.get(node.node_id) == node:
            return
        held = {
            gpu
            for run in self._running.values()
            if run.node_id == node.node_id
            for gpu in run.gpu_indices
        }
        self._nodes[node.node_id] = node
        self._free[node.node_id] = tuple(g for g in sorted(node.gpu_indices) if g not in held)

    def _end(self, event: TaskEnded) -> None:
        run = self._running.get(event.job_id)
        if run is None or run.task_id != event.task_id:
            return
        del self._running[event.job_id]
        self._stopping.discard(event.job_id)
        node = self._nodes.get(run.node_id)
        if node is not None:
            still_present = tuple(g for g in run.gpu_indices if g in node.gpu_indices)
            self._free[run.node_id] = tuple(sorted(self._free[run.node_id] + still_present))

    def _cancel(self, job_id: str) -> list[Decision]:
        if job_id in self._queue:
            del self._queue[job_id]
            self._reasons.pop(job_id, None)
            return [Cancel(job_id, "cancelled before it started"), *self._schedule()]
        run = self._running.get(job_id)
        if run is not None and job_id not in self._stopping:
            self._stopping.add(job_id)
            return [
                Stop(job_id, run.task_id, run.node_id, StopCause.CANCELLED, "cancelled by user")
            ]
        return []

    def _schedule(self) -> list[Decision]:
        decisions: list[Decision] = []
        for job_id, spec in list(self._queue.items()):
            fit = first_fit(spec, self._nodes, self._free)
            if isinstance(fit, Fit):
                del self._queue[job_id]
                self._reasons.pop(job_id, None)
                taken = set(fit.gpu_indices)
                self._free[fit.node_id] = tuple(
                    g for g in self._free[fit.node_id] if g not in taken
                )
                task_id = f"{job_id}/0"
                self._running[job_id] = _Running(task_id, fit.node_id, fit.gpu_indices)
                decisions.append(Place(job_id, task_id, fit.node_id, fit.gpu_indices, spec))
            elif self._reasons.get(job_id) != fit.reason:
                self._reasons[job_id] = fit.reason
                decisions.append(Wait(job_id, fit.reason))
        return decisions
