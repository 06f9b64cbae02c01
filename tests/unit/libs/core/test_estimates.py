"""Runtime estimates: the requested limit, else the user's learned runtimes, else none."""

from __future__ import annotations

import pytest

from libs.core import CancelRequested, Input, JobArrived, NodeJoined, Scheduler, TaskEnded
from libs.core.estimates import LEARNED_JOBS, estimate_s, learned_s
from libs.core.inputs import TaskStarted
from tests.builders import job, node


@pytest.mark.parametrize(
    ("runtimes", "expected"),
    [
        ((), None),
        ((60.0,), 60.0),
        ((10.0, 20.0, 30.0, 40.0, 50.0), 40.0),  # the 4th of 5
        # One runaway does not drag it, as it would a mean; one crash neither.
        ((100.0,) * 8 + (1.0, 1e6), 100.0),
    ],
)
def test_the_learned_figure_is_the_80th_percentile(
    runtimes: tuple[float, ...], expected: float | None
) -> None:
    assert learned_s(runtimes) == expected


def test_a_requested_limit_comes_before_the_learned_figure() -> None:
    learned = {"alice": (100.0,)}
    assert estimate_s(job(1, runtime_estimate_s=30.0), learned) == 30.0
    assert estimate_s(job(1), learned) == 100.0
    assert estimate_s(job(1, user="bob"), learned) is None


def ran(job_id: str, start: float, end: float, user: str = "alice") -> list[Input]:
    task = f"{job_id}/0"
    return [
        JobArrived(start, job_id, job(1, user=user)),
        TaskStarted(start, job_id, task, "n1"),
        TaskEnded(end, job_id, task, "n1"),
    ]


def test_the_scheduler_learns_from_jobs_that_ran_to_their_end() -> None:
    scheduler = Scheduler()
    inputs: list[Input] = [NodeJoined(0, node("n1")), *ran("a", 1, 101), *ran("b", 200, 230)]
    # Cancelled work says nothing of how long the user's jobs run.
    inputs += [JobArrived(300, "c", job(1)), TaskStarted(300, "c", "c/0", "n1")]
    inputs += [CancelRequested(301, "c"), TaskEnded(302, "c", "c/0", "n1")]
    for event in inputs:
        scheduler.handle(event)
    assert scheduler.estimate_s(job(1)) == 100.0  # the 80th percentile of (30, 100)
    assert scheduler.estimate_s(job(1, runtime_estimate_s=5.0)) == 5.0
    assert scheduler.estimate_s(job(1, user="bob")) is None
    assert scheduler.digest() == scheduler.recomputed_digest()


def test_only_the_latest_runtimes_are_kept() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeJoined(0, node("n1")))
    for i in range(LEARNED_JOBS):
        for event in ran(f"old{i}", 1000 * i, 1000 * i + 500):
            scheduler.handle(event)
    for i in range(LEARNED_JOBS):
        at = 1000 * (LEARNED_JOBS + i)
        for event in ran(f"new{i}", at, at + 10):
            scheduler.handle(event)
    assert scheduler.estimate_s(job(1)) == 10.0
