"""The scheduler's input: one totally ordered stream of these, each with its time.

Time is ``at`` (seconds since the epoch, from the event's timestamp); the core
never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.model import JobSpec, NodeSpec


@dataclass(frozen=True)
class JobArrived:
    at: float
    job_id: str
    spec: JobSpec


@dataclass(frozen=True)
class NodeJoined:
    at: float
    node: NodeSpec


@dataclass(frozen=True)
class TaskEnded:
    at: float
    job_id: str
    task_id: str
    node_id: str


@dataclass(frozen=True)
class CancelRequested:
    at: float
    job_id: str


@dataclass(frozen=True)
class Tick:
    at: float


Input = JobArrived | NodeJoined | TaskEnded | CancelRequested | Tick
