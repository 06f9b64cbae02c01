"""What both baseline policies share: the task lifecycle, cancellation and preemption ends.

A subclass keeps its own queue and decides what to start (``_schedule``); this
class starts it, frees GPUs when tasks end, and turns the end of a preempted
job into ``Requeue`` (resumable) or ``Preempted``. A pass runs only after an
input that can change what fits; ticks, snapshots and idle reports change
nothing for these policies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from libs.core.baselines._inventory import Inventory, Placement
from libs.core.budget_tree import BudgetTree
from libs.core.decisions import Cancel, Decision, Place, Preempted, Requeue, Stop, StopCause, Wait
from libs.core.ids import JobId, NodeId, TaskId, batch_task_id
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    NodeJoined,
    TaskEnded,
)
from libs.core.model import JobSpec
from libs.core.validation import rejection
from libs.core.wait_reasons import WaitReason


@dataclass
class Running:
    job_id: JobId
    spec: JobSpec
    seq: int  # submission order
    attempt: int
    node_id: NodeId  # its (first) node
    tasks: dict[TaskId, tuple[NodeId, tuple[int, ...]]] = field(default_factory=dict)
    stopping: StopCause | None = None
    preemptible: bool = False


class BaselinePolicy(ABC):
    def __init__(self) -> None:
        self.inventory = Inventory()
        self.running: dict[str, Running] = {}
        self._seq: dict[str, int] = {}  # every job ever seen -> submission order
        self._attempts: dict[str, int] = {}

    def handle(self, event: Input) -> list[Decision]:
        decisions: list[Decision] = []
        match event:
            case JobArrived(job_id=job_id, spec=spec):
                if job_id in self._seq:
                    return []
                self._seq[job_id] = len(self._seq)
                rejected = rejection(job_id, spec)
                if rejected is not None:
                    return [rejected]
                self._enqueue(job_id, spec)
                decisions = self._schedule()
                if self._is_waiting(job_id):
                    decisions.append(Wait(job_id, self._reason(job_id)))
                return decisions
            case NodeJoined(node=node):
                self.inventory.join(node)
                self._capacity_changed()
            case BudgetSet(tree=tree):
                self._budget(tree)
            case TaskEnded():
                decisions = self._end(event)
            case CancelRequested(job_id=job_id):
                decisions = self._cancel(job_id)
            case _:
                return []
        return decisions + self._schedule()

    # --- what a subclass decides ---

    @abstractmethod
    def _enqueue(self, job_id: JobId, spec: JobSpec) -> None:
        """Add a new or requeued job to the waiting work."""

    @abstractmethod
    def _dequeue(self, job_id: JobId) -> JobSpec | None:
        """Remove a waiting job; None if it is not waiting."""

    @abstractmethod
    def _is_waiting(self, job_id: JobId) -> bool:
        """Whether the job is queued."""

    @abstractmethod
    def _reason(self, job_id: JobId) -> WaitReason:
        """Why a queued job waits, for the person who asks."""

    @abstractmethod
    def _schedule(self) -> list[Decision]:
        """Start whatever the policy lets start now (and preempt, if it does)."""

    def _budget(self, tree: BudgetTree) -> None:  # noqa: B027 (an optional hook)
        """The budget tree changed; only policies with team limits care."""

    def _capacity_changed(self) -> None:  # noqa: B027
        """A node joined; only policies with team limits care."""

    def _started(self, job: Running) -> None:  # noqa: B027
        """Bookkeeping after a job is placed."""

    def _ended(self, job: Running) -> None:  # noqa: B027
        """Bookkeeping after a job's last task ended."""

    # --- shared mechanics ---

    def _start(self, job_id: JobId, spec: JobSpec, placement: Placement) -> list[Decision]:
        attempt = self._attempts.get(job_id, 0)
        job = Running(job_id, spec, self._seq[job_id], attempt, placement[0][0])
        decisions: list[Decision] = []
        for k, (node_id, gpus) in enumerate(placement):
            task_id = batch_task_id(job_id, attempt, k)
            self.inventory.take(node_id, gpus)
            job.tasks[task_id] = (node_id, gpus)
            decisions.append(Place(job_id, task_id, node_id, gpus, spec))
        self.running[job_id] = job
        self._started(job)
        return decisions

    def _stop(self, job: Running, cause: StopCause, reason: str) -> list[Decision]:
        job.stopping = cause
        return [
            Stop(job.job_id, task_id, node_id, cause, reason)
            for task_id, (node_id, _) in job.tasks.items()
        ]

    def _end(self, event: TaskEnded) -> list[Decision]:
        job = self.running.get(event.job_id)
        if job is None or event.task_id not in job.tasks:
            return []
        node_id, gpus = job.tasks.pop(event.task_id)
        self.inventory.release(node_id, gpus)
        if job.tasks:
            return []
        del self.running[job.job_id]
        self._ended(job)
        if job.stopping is not StopCause.PREEMPTED:
            return []
        if job.spec.resumable:
            self._attempts[job.job_id] = job.attempt + 1
            self._enqueue(job.job_id, job.spec)
            return [Requeue(job.job_id, "preempted; waits again in its old place")]
        return [Preempted(job.job_id, "preempted; not resumable")]

    def _cancel(self, job_id: JobId) -> list[Decision]:
        if self._dequeue(job_id) is not None:
            return [Cancel(job_id, "cancelled before it started")]
        job = self.running.get(job_id)
        if job is None or job.stopping is StopCause.CANCELLED:
            return []
        return self._stop(job, StopCause.CANCELLED, "cancelled by user")
