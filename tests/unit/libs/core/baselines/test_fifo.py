"""FIFO: arrival order, first fit, gangs over whole nodes, no preemption, no backfill."""

from __future__ import annotations

from dataclasses import dataclass, field
from string import ascii_lowercase

import pytest

from libs.core import (
    Cancel,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    NodeJoined,
    Place,
    Stop,
    StopCause,
    TaskEnded,
    Tick,
    UsageSnapshot,
)
from libs.core.baselines import FifoPolicy
from tests.builders import decided, job, node


@dataclass
class Case:
    name: str
    inputs: list[Input]
    placed: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    others: list[Decision] = field(default_factory=list)


NODES: list[Input] = [NodeJoined(0, node("n2")), NodeJoined(0, node("n1"))]


def arrivals(*gpus: int) -> list[Input]:
    """Jobs a, b, c... of these sizes, one a second from t=1."""
    return [JobArrived(i + 1, ascii_lowercase[i], job(n)) for i, n in enumerate(gpus)]


CASES = [
    Case(
        "first fit: the lowest node id, the lowest GPU indices",
        [*NODES, *arrivals(3, 6)],
        placed=[("a", "n1", (0, 1, 2)), ("b", "n2", (0, 1, 2, 3, 4, 5))],
    ),
    Case(
        "no backfill: a small job waits behind a head that does not fit",
        [*NODES, *arrivals(6, 8, 8, 1)],
        placed=[("a", "n1", (0, 1, 2, 3, 4, 5)), ("b", "n2", tuple(range(8)))],
    ),
    Case(
        "the head starts when a task ends, then those behind it in order",
        [*NODES, *arrivals(8, 8, 8, 1), TaskEnded(5, "a", "a/0.0", "n1")],
        placed=[
            ("a", "n1", tuple(range(8))),
            ("b", "n2", tuple(range(8))),
            ("c", "n1", tuple(range(8))),
        ],
    ),
    Case(
        "a gang takes whole free nodes, one placement per node",
        [*NODES, JobArrived(1, "g", job(12))],
        placed=[("g", "n1", tuple(range(8))), ("g", "n2", (0, 1, 2, 3))],
    ),
    Case(
        "a job bigger than the cluster is set aside instead of blocking",
        [*NODES, JobArrived(1, "huge", job(32)), JobArrived(2, "b", job(1))],
        placed=[("b", "n1", (0,))],
    ),
    Case(
        "cancelling a waiting job withdraws it; a running one is stopped",
        [
            NodeJoined(0, node("n1")),
            *arrivals(8, 8),
            CancelRequested(3, "b"),
            CancelRequested(4, "a"),
        ],
        placed=[("a", "n1", tuple(range(8)))],
        others=[
            Cancel("b", "cancelled before it started"),
            Stop("a", "a/0.0", "n1", StopCause.CANCELLED, "cancelled by user"),
        ],
    ),
    Case(
        "a repeated submission, ticks and snapshots decide nothing",
        [
            NodeJoined(0, node("n1")),
            JobArrived(1, "a", job(8)),
            JobArrived(2, "a", job(8)),
            Tick(3),
            UsageSnapshot(4, 60, (("team-a", 10.0),)),
        ],
        placed=[("a", "n1", tuple(range(8)))],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fifo(case: Case) -> None:
    decisions = decided(FifoPolicy(), case.inputs)
    placed = [(d.job_id, d.node_id, d.gpu_indices) for d in decisions if isinstance(d, Place)]
    assert placed == case.placed
    others = [d for d in decisions if isinstance(d, Cancel | Stop)]
    assert others == case.others


def test_a_cancelled_job_is_not_requeued_when_its_task_ends() -> None:
    policy = FifoPolicy()
    for event in (NodeJoined(0, node("n1")), JobArrived(1, "a", job(8)), CancelRequested(2, "a")):
        policy.handle(event)
    assert policy.handle(TaskEnded(3, "a", "a/0.0", "n1", 143)) == []
    assert policy.handle(JobArrived(4, "b", job(8)))[0] == Place(
        "b", "b/0.0", "n1", tuple(range(8)), job(8)
    )
