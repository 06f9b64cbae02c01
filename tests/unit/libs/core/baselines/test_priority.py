"""The priority baseline: levels, team caps, backfill, and preemption of lower backfill."""

from __future__ import annotations

import pytest

from libs.config.budget import tree_from_mapping
from libs.core import (
    BudgetSet,
    Decision,
    Input,
    JobArrived,
    NodeJoined,
    Place,
    Preempted,
    Requeue,
    Stop,
    StopCause,
    TaskEnded,
)
from libs.core.baselines import Level, PriorityPolicy, level_of
from tests.builders import decided, job, node

# team-a is entitled to half of 16 GPUs: a cap of 8 guaranteed GPUs; team-b likewise.
SETUP: list[Input] = [
    BudgetSet(
        0, tree_from_mapping({"name": "root", "children": [{"name": "team-a"}, {"name": "team-b"}]})
    ),
    NodeJoined(0, node("n1")),
    NodeJoined(0, node("n2")),
]
LOW, HIGH, URGENT = -1, 1, 2


def run(policy: PriorityPolicy, *inputs: Input) -> list[Decision]:
    return decided(policy, [*SETUP, *inputs])


def places(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.job_id, d.node_id) for d in decisions if isinstance(d, Place)]


def stops(decisions: list[Decision]) -> list[str]:
    return [d.task_id for d in decisions if isinstance(d, Stop)]


@pytest.mark.parametrize(
    ("priority", "level"), [(-5, Level.LOW), (0, Level.NORMAL), (1, Level.HIGH), (9, Level.URGENT)]
)
def test_priorities_map_to_four_levels(priority: int, level: Level) -> None:
    assert level_of(priority) is level


@pytest.mark.parametrize(
    ("inputs", "placed"),
    [
        pytest.param(
            [
                JobArrived(1, "fill1", job(8, priority=URGENT)),
                JobArrived(1, "fill2", job(8, allocation="team-b", priority=URGENT)),
                JobArrived(2, "low", job(8, priority=LOW)),
                JobArrived(3, "high", job(8, priority=HIGH)),
                TaskEnded(4, "fill1", "fill1/0.0", "n1"),
            ],
            [("fill1", "n1"), ("fill2", "n2"), ("high", "n1")],
            id="the higher level gets freed GPUs first, whatever the arrival order",
        ),
        pytest.param(
            [
                JobArrived(1, "a", job(6, priority=URGENT)),
                JobArrived(1, "b", job(6, allocation="team-b", priority=URGENT)),
                JobArrived(2, "big", job(8, priority=URGENT)),
                JobArrived(3, "small", job(2, allocation="team-b", priority=LOW)),
            ],
            [("a", "n1"), ("b", "n2"), ("small", "n1")],
            id="smaller lower work backfills around a big job that waits",
        ),
    ],
)
def test_placement_order(inputs: list[Input], placed: list[tuple[str, str]]) -> None:
    assert places(run(PriorityPolicy(), *inputs)) == placed


def test_work_beyond_the_team_cap_is_backfill_that_higher_levels_preempt() -> None:
    policy = PriorityPolicy()
    decisions = run(
        policy,
        JobArrived(1, "a1", job(8, priority=LOW)),  # within team-a's cap of 8: guaranteed
        JobArrived(2, "a2", job(8, priority=LOW, resumable=True)),  # beyond it: backfill
        JobArrived(3, "b1", job(4, allocation="team-b", priority=HIGH)),
    )
    assert places(decisions) == [("a1", "n1"), ("a2", "n2")]
    assert stops(decisions) == ["a2/0.0"]  # not a1: guaranteed work is never preempted
    ended = policy.handle(TaskEnded(4, "a2", "a2/0.0", "n2", 143))
    assert isinstance(ended[0], Requeue)
    assert places(ended) == [("b1", "n2")]


def test_a_preempted_job_that_cannot_resume_ends() -> None:
    policy = PriorityPolicy()
    run(
        policy,
        JobArrived(1, "a1", job(8, priority=LOW)),
        JobArrived(2, "a2", job(8, priority=LOW)),
        JobArrived(3, "b1", job(8, allocation="team-b", priority=URGENT)),
    )
    ended = policy.handle(TaskEnded(4, "a2", "a2/0.0", "n2", 143))
    assert ended[0] == Preempted("a2", "preempted; not resumable")


def test_equal_levels_do_not_preempt_and_room_is_made_only_once() -> None:
    policy = PriorityPolicy()
    decisions = run(
        policy,
        JobArrived(1, "a1", job(8, priority=HIGH)),
        JobArrived(2, "a2", job(4, priority=HIGH)),  # backfill
        JobArrived(3, "a3", job(4, priority=LOW)),  # backfill
        JobArrived(4, "b1", job(8, allocation="team-b", priority=HIGH)),
        JobArrived(5, "b2", job(8, allocation="team-b", priority=HIGH)),
    )
    assert places(decisions) == [("a1", "n1"), ("a2", "n2"), ("a3", "n2")]
    # b1 may stop only the LOW backfill, which frees 4 GPUs: not enough, so nothing stops.
    assert stops(decisions) == []


def test_victims_are_the_lowest_level_then_the_newest() -> None:
    policy = PriorityPolicy()
    decisions = run(
        policy,
        JobArrived(1, "a1", job(8, priority=LOW)),
        JobArrived(2, "old", job(2, priority=LOW)),
        JobArrived(3, "new", job(2, priority=LOW)),
        JobArrived(4, "mid", job(2, priority=0)),
        JobArrived(5, "b1", job(2, allocation="team-b", priority=URGENT)),
        JobArrived(6, "b2", job(4, allocation="team-b", priority=URGENT)),
    )
    assert places(decisions) == [
        ("a1", "n1"),
        ("old", "n2"),
        ("new", "n2"),
        ("mid", "n2"),
        ("b1", "n2"),
    ]
    assert stops(decisions) == ["new/0.0", "old/0.0"]
    assert all(d.cause is StopCause.PREEMPTED for d in decisions if isinstance(d, Stop))
