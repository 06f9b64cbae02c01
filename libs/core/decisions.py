"""What the scheduler decides. Each becomes one output event at the service edge."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.core.model import JobSpec


@dataclass(frozen=True)
class Place:
    """Start one task of a job on one node (a gang spanning nodes is one Place per node)."""

    job_id: str
    task_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    spec: JobSpec


@dataclass(frozen=True)
class Wait:
    """The job cannot start now; ``reason`` is for the person who asks why."""

    job_id: str
    reason: str


class StopCause(enum.Enum):
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class Stop:
    """Ask a node agent to stop a running task."""

    job_id: str
    task_id: str
    node_id: str
    cause: StopCause
    reason: str


@dataclass(frozen=True)
class Cancel:
    """A job that never started is withdrawn."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Requeue:
    """A preempted resumable job waits again; it keeps its place by submission order."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Preempted:
    """A preempted job that is not resumable ends here."""

    job_id: str
    reason: str


Decision = Place | Wait | Stop | Cancel | Requeue | Preempted
