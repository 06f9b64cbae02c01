"""Scenario tables for the first-fit scheduler: inputs in, wanted decisions out."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from libs.core import (
    Cancel,
    CancelRequested,
    Input,
    JobArrived,
    NodeJoined,
    Place,
    Scheduler,
    Stop,
    TaskEnded,
    Tick,
    Wait,
)
from libs.core.wait_reasons import WaitCode, WaitReason
from tests.builders import decided, job, node


@dataclass
class Case:
    name: str
    inputs: list[Input]
    placed: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    other: list[type] = field(default_factory=list)


CASES = [
    Case(
        "fits on the first node (in registration order) with room, lowest GPUs first",
        [NodeJoined(0, node("n2")), NodeJoined(0, node("n1")), JobArrived(1, "j1", job(2))],
        placed={"j1": ("n2", (0, 1))},
    ),
    Case(
        "a job larger than any node says so",
        [NodeJoined(0, node("n1", 4)), JobArrived(1, "j1", job(8))],
        waiting={"j1": "needs 8×GPU; the cluster has only 4 such GPUs"},
    ),
    Case(
        "waits for the largest free block, then starts when a task ends",
        [
            NodeJoined(0, node("n1")),
            JobArrived(1, "j1", job(6)),
            JobArrived(2, "j2", job(4)),
            TaskEnded(3, "j1", "j1/0", "n1"),
        ],
        placed={"j1": ("n1", (0, 1, 2, 3, 4, 5)), "j2": ("n1", (0, 1, 2, 3))},
        waiting={"j2": "needs 4×GPU on one node; waiting for a block that large to free up"},
    ),
    Case(
        "GPU type is a constraint",
        [
            NodeJoined(0, node("a100", gpu_type="A100")),
            NodeJoined(0, node("h100", gpu_type="H100")),
            JobArrived(1, "j1", job(1, gpu_type="H100")),
        ],
        placed={"j1": ("h100", (0,))},
    ),
    Case(
        "a job that arrives before any node waits, then starts when one joins",
        [JobArrived(1, "j1", job(1)), NodeJoined(2, node("n1"))],
        placed={"j1": ("n1", (0,))},
        waiting={"j1": "needs 1×GPU; no node has registered yet"},
    ),
    Case(
        "a duplicate submission is decided once",
        [NodeJoined(0, node("n1")), JobArrived(1, "j1", job(1)), JobArrived(2, "j1", job(1))],
        placed={"j1": ("n1", (0,))},
    ),
    Case(
        "cancelling a queued job withdraws it",
        [NodeJoined(0, node("n1", 1)), JobArrived(1, "j1", job(2)), CancelRequested(2, "j1")],
        waiting={"j1": "needs 2×GPU; the cluster has only 1 such GPUs"},
        other=[Cancel],
    ),
    Case(
        "cancelling a running job asks its node to stop it, once",
        [
            NodeJoined(0, node("n1")),
            JobArrived(1, "j1", job(1)),
            CancelRequested(2, "j1"),
            CancelRequested(3, "j1"),
        ],
        placed={"j1": ("n1", (0,))},
        other=[Stop],
    ),
    Case(
        "a tick changes nothing when nothing changed",
        [NodeJoined(0, node("n1")), Tick(5)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scenario(case: Case) -> None:
    decisions = decided(Scheduler(), case.inputs)
    placed = {d.job_id: (d.node_id, d.gpu_indices) for d in decisions if isinstance(d, Place)}
    waiting = {d.job_id: d.reason for d in decisions if isinstance(d, Wait)}
    other = [type(d) for d in decisions if not isinstance(d, Place | Wait)]
    assert placed == case.placed
    assert waiting == case.waiting
    assert other == case.other


def test_a_wait_reason_is_emitted_only_when_it_changes() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1")))
    scheduler.handle(JobArrived(1, "big", job(8)))
    assert scheduler.handle(JobArrived(2, "j2", job(8))) == [
        Wait("j2", WaitReason.of(WaitCode.NO_BLOCK, needs="8×GPU"))
    ]
    assert scheduler.handle(Tick(3)) == []


def test_gpus_freed_by_an_ended_task_are_reused() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1", 2)))
    scheduler.handle(JobArrived(1, "j1", job(2)))
    scheduler.handle(TaskEnded(2, "j1", "j1/0", "n1"))
    [placed] = scheduler.handle(JobArrived(3, "j2", job(2)))
    assert isinstance(placed, Place) and placed.gpu_indices == (0, 1)


def test_an_end_for_an_unknown_task_is_ignored() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1", 2)))
    before = scheduler.digest()
    assert scheduler.handle(TaskEnded(1, "ghost", "ghost/0", "n1")) == []
    assert scheduler.digest() == before


@pytest.mark.parametrize(
    ("task_id", "node_id"),
    [("j1/7", ""), ("j1/7", "n1"), ("", ""), ("j1/0", ""), ("j1/0", "n2")],
)
def test_an_end_of_a_running_job_that_names_no_task_of_it_is_ignored(
    task_id: str, node_id: str
) -> None:
    # A task no one placed, or a node not the task's (an empty one too): nothing changes.
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1", 2)))
    scheduler.handle(JobArrived(1, "j1", job(1)))
    before = scheduler.digest()
    assert scheduler.handle(TaskEnded(1, "j1", task_id, node_id)) == []
    assert scheduler.digest() == before


def test_a_node_that_re_registers_keeps_its_running_tasks_gpus() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1", 2)))
    scheduler.handle(JobArrived(1, "j1", job(1)))
    scheduler.handle(NodeJoined(2, node("n1", 4)))
    [placed] = scheduler.handle(JobArrived(3, "j2", job(3)))
    assert isinstance(placed, Place) and placed.gpu_indices == (1, 2, 3)
