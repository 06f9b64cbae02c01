"""Earmarks (``libs/core/earmarks.py``): when a blocked job likely gets room, and where."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from libs.core.contract import RunningJob, victims_of
from libs.core.earmarks import Earmark, earliest, floors, release_time, soonest_nodes
from libs.core.rooms import room_of
from tests.builders import job

HOUR = 3600.0
NOW = 10 * HOUR
RANK = {"first": 0, "second": 1}
WAITING = job(16, allocation="first", min_runtime_s=60)
NOW_RULE = victims_of(WAITING, RANK, NOW)
LATER_RULE = victims_of(WAITING, RANK, math.inf)


def running(
    allocation: str,
    *,
    started_at: float = 0.0,
    protect_s: float = 0.0,
    estimate_s: float | None = None,
    resumable: bool = True,
    gpus: int = 8,
) -> RunningJob:
    spec = job(gpus, allocation=allocation, min_runtime_s=60, resumable=resumable)
    return RunningJob("v", spec, "n0", gpus, started_at, False, 1, protect_s, estimate_s)


def of(releases: dict[str, list[tuple[float, int]]]) -> Callable[[str], list[tuple[float, int]]]:
    return lambda node_id: releases.get(node_id, [])


def when(victim: RunningJob) -> float:
    return release_time(victim, NOW_RULE, LATER_RULE, NOW)


def test_work_it_may_preempt_now_lets_go_now() -> None:
    assert when(running("second")) == NOW


def test_protected_work_it_may_preempt_later_lets_go_when_its_contract_ends() -> None:
    assert when(running("second", started_at=NOW - HOUR, protect_s=3 * HOUR)) == NOW + 2 * HOUR
    # ... unless it likely ends sooner by itself.
    ends_first = running("second", started_at=NOW - HOUR, protect_s=3 * HOUR, estimate_s=HOUR)
    assert when(ends_first) == NOW + 2 * HOUR  # its estimate is already outrun: unknown
    ends_soon = running("second", started_at=NOW - HOUR, protect_s=3 * HOUR, estimate_s=2 * HOUR)
    assert when(ends_soon) == NOW + HOUR


def test_work_it_may_not_preempt_lets_go_at_its_likely_end_or_never_that_anyone_knows() -> None:
    assert when(running("first", estimate_s=12 * HOUR)) == NOW + 2 * HOUR
    assert when(running("first")) == math.inf
    assert when(running("first", estimate_s=9 * HOUR)) == math.inf  # outrun: no telling


def test_work_that_cannot_resume_lets_go_only_at_its_likely_end() -> None:
    # Stopping it would throw its work away: wait for it.
    old = running("second", resumable=False, estimate_s=11 * HOUR)
    assert when(old) == NOW + HOUR
    young = running("second", resumable=False, started_at=NOW - HOUR, estimate_s=10 * HOUR)
    assert when(young) == NOW + 9 * HOUR
    assert when(running("second", resumable=False)) == math.inf


def test_a_gang_gets_the_fewest_whole_nodes_that_free_soonest() -> None:
    candidates = [("n0", 8, 0, None), ("n1", 8, 0, None), ("n2", 8, 8, None), ("n3", 4, 4, None)]
    releases = {"n0": [(NOW + 3 * HOUR, 8)], "n1": [(NOW + HOUR, 4), (NOW + 2 * HOUR, 4)]}
    assert soonest_nodes(WAITING, candidates, of(releases), NOW) == Earmark(
        ("n1", "n2"), NOW + 2 * HOUR
    )


def test_a_single_node_job_gets_the_node_with_room_soonest() -> None:
    small = job(6, allocation="first", min_runtime_s=60)
    candidates = [("n0", 8, 2, None), ("n1", 8, 0, None)]
    releases = {"n0": [(NOW + 3 * HOUR, 4)], "n1": [(NOW + HOUR, 4), (NOW + 2 * HOUR, 4)]}
    assert soonest_nodes(small, candidates, of(releases), NOW) == Earmark(("n1",), NOW + 2 * HOUR)


def test_no_earmark_where_nobody_knows_when_room_comes() -> None:
    candidates = [("n0", 8, 0, None), ("n1", 8, 0, None)]
    releases = {"n0": [(NOW, 8)], "n1": [(math.inf, 8)]}
    assert soonest_nodes(WAITING, candidates, of(releases), NOW) is None
    assert soonest_nodes(WAITING, [], of({}), NOW) is None


def test_weighing_nodes_soonest_bound_first_picks_the_same_nodes() -> None:
    """``earliest`` never comes after ``release_time`` frees the GPUs, so the nodes it
    lets ``soonest_nodes`` leave unweighed could not have been chosen."""
    rng = random.Random(7)
    for _ in range(1500):
        now = rng.choice([NOW, NOW + HOUR])
        on: dict[str, list[RunningJob]] = {}
        for n in range(rng.randint(1, 8)):
            room, on[f"n{n}"] = 8, []
            while room and rng.random() < 0.7:
                gpus = rng.randint(1, room)
                victim = running(
                    rng.choice(["first", "second"]),
                    started_at=rng.choice([NOW - 2 * HOUR, NOW - HOUR, now]),
                    protect_s=rng.choice([0.0, HOUR, 3 * HOUR]),
                    estimate_s=rng.choice([None, HOUR, 2 * HOUR, 4 * HOUR]),
                    resumable=rng.random() < 0.5,
                    gpus=gpus,
                )
                on[f"n{n}"].append(victim)
                room -= gpus
        waiting = job(
            rng.choice([1, 4, 8, 16]), allocation=rng.choice(["first", "second"]), min_runtime_s=60
        )
        may_now, may_later = victims_of(waiting, RANK, now), victims_of(waiting, RANK, math.inf)
        releases = {
            n: [(release_time(v, may_now, may_later, now), v.gpus) for v in vs]
            for n, vs in on.items()
        }
        node_floors = {n: floors(room_of(vs)) for n, vs in on.items()}
        free = {n: 8 - sum(v.gpus for v in vs) for n, vs in on.items()}
        for n in on:  # no later than the GPUs are let go
            for gpus in range(1, 9 - free[n]):
                let_go = sorted(when for when, held in releases[n] for _ in range(held))
                assert earliest(node_floors[n], gpus, now) <= let_go[gpus - 1]
        unbounded = [(n, 8, free[n], None) for n in on]
        bounded = [(n, 8, free[n], node_floors[n]) for n in on]
        expected = soonest_nodes(waiting, unbounded, of(releases), now)
        assert soonest_nodes(waiting, bounded, of(releases), now) == expected
