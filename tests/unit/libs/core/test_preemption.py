"""Preemption planning (``libs/core/preemption.py``): the cheapest victims that make room."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from libs.core.contract import RunningJob
from libs.core.model import JobSpec
from libs.core.preemption import Plan, _cost, plan_preemption
from libs.core.rooms import bound, room_of
from tests.builders import job

HOUR = 3600.0
NOW = 10 * HOUR
RANK = {"first": 0, "second": 1, "third": 2}
WAITING = job(4, allocation="first", min_runtime_s=3600)  # ranked first, allocated


def run(
    job_id: str,
    node_id: str,
    gpus: int,
    *,
    allocation: str = "third",
    min_runtime_s: int = 0,
    started_at: float | None = 0.0,
    idle: bool = False,
    seq: int = 1,
    resumable: bool = False,
) -> RunningJob:
    spec = job(gpus, allocation=allocation, min_runtime_s=min_runtime_s, resumable=resumable)
    return RunningJob(job_id, spec, node_id, gpus, started_at, idle, seq, float(min_runtime_s))


def ids(plan: Plan | None) -> tuple[tuple[str, ...], list[str]] | None:
    return None if plan is None else (plan.node_ids, [v.job_id for v in plan.victims])


def test_no_candidate_node_means_no_plan() -> None:
    assert plan_preemption(WAITING, [], {}, RANK, NOW) is None


def test_a_node_with_room_already_needs_no_preemption() -> None:
    on = {"n0": [run("free", "n0", 4)]}
    assert plan_preemption(WAITING, [("n0", 8, 4)], on, RANK, NOW) is None


def test_free_work_is_stopped_before_past_contract_allocated_work() -> None:
    on = {
        "n0": [run("paid", "n0", 8, allocation="third", min_runtime_s=60)],
        "n1": [run("free", "n1", 8)],
    }
    plan = plan_preemption(WAITING, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n1",), ["free"])


def test_only_as_many_victims_as_the_job_needs_smallest_first() -> None:
    on = {
        "n0": [
            run("big", "n0", 4, seq=1),
            run("small-old", "n0", 2, seq=2),
            run("small-new", "n0", 2, seq=3),
        ]
    }
    plan = plan_preemption(WAITING, [("n0", 8, 0)], on, RANK, NOW)
    # Victim order is fewest GPUs first (then newest): two small jobs, not the big one.
    assert ids(plan) == (("n0",), ["small-new", "small-old"])


def test_free_gpus_on_the_node_count_toward_the_room() -> None:
    on = {"n0": [run("a", "n0", 2, seq=1), run("b", "n0", 4, seq=2)]}
    plan = plan_preemption(WAITING, [("n0", 8, 2)], on, RANK, NOW)
    assert ids(plan) == (("n0",), ["a"])  # 2 free + 2 freed = 4


def test_protected_work_is_never_a_victim() -> None:
    on = {"n0": [run("young", "n0", 8, allocation="third", min_runtime_s=3600, started_at=NOW)]}
    assert plan_preemption(WAITING, [("n0", 8, 0)], on, RANK, NOW) is None
    assert ids(plan_preemption(WAITING, [("n0", 8, 0)], on, RANK, NOW + 3600)) == (
        ("n0",),
        ["young"],
    )


def test_work_of_a_higher_ranked_allocation_is_not_a_victim() -> None:
    waiting = job(4, allocation="second", min_runtime_s=3600)
    on = {"n0": [run("above", "n0", 8, allocation="first", min_runtime_s=60)]}
    assert plan_preemption(waiting, [("n0", 8, 0)], on, RANK, NOW) is None


def test_idle_allocated_work_is_cheaper_than_busy_allocated_work() -> None:
    on = {
        "n0": [run("busy", "n0", 8, min_runtime_s=60)],
        "n1": [run("idle", "n1", 8, min_runtime_s=60, idle=True)],
    }
    plan = plan_preemption(WAITING, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n1",), ["idle"])


def test_the_fewest_disturbed_gpus_win() -> None:
    on = {
        "n0": [run("eight", "n0", 8)],
        "n1": [run("four-a", "n1", 4, seq=1), run("four-b", "n1", 4, seq=2)],
    }
    plan = plan_preemption(WAITING, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n1",), ["four-b"])  # 4 GPUs disturbed, not 8


def test_with_as_many_gpus_disturbed_the_fewest_jobs_win() -> None:
    on = {
        "n0": [run("two-a", "n0", 2, seq=1), run("two-b", "n0", 2, seq=2), run("x", "n0", 4)],
        "n1": [run("four-a", "n1", 4, seq=3), run("four-b", "n1", 4, seq=4)],
    }
    plan = plan_preemption(WAITING, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n1",), ["four-b"])  # one job of 4 GPUs, not two of 2


def test_equal_costs_are_broken_by_node_id() -> None:
    on = {"n1": [run("x", "n1", 8)], "n0": [run("y", "n0", 8)]}
    plan = plan_preemption(WAITING, [("n1", 8, 0), ("n0", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n0",), ["y"])


def test_a_node_too_small_for_the_job_is_not_considered() -> None:
    on = {"small": [run("x", "small", 2)], "n0": [run("y", "n0", 8, min_runtime_s=60)]}
    plan = plan_preemption(WAITING, [("small", 2, 0), ("n0", 8, 0)], on, RANK, NOW)
    assert ids(plan) == (("n0",), ["y"])


# -- gangs: whole nodes --------------------------------------------------------

GANG = job(16, allocation="first", min_runtime_s=3600)


def test_a_gang_frees_whole_nodes_the_cheapest_ones() -> None:
    on = {
        "n0": [run("paid", "n0", 8, min_runtime_s=60)],
        "n1": [run("free-1", "n1", 8)],
        "n2": [run("free-2a", "n2", 4), run("free-2b", "n2", 4)],
    }
    nodes = [("n0", 8, 0), ("n1", 8, 0), ("n2", 8, 0)]
    plan = plan_preemption(GANG, nodes, on, RANK, NOW)
    assert ids(plan) == (("n1", "n2"), ["free-1", "free-2a", "free-2b"])


def test_a_gang_uses_a_wholly_free_node_and_preempts_only_for_the_rest() -> None:
    on = {"n1": [run("free", "n1", 8)], "n2": [run("paid", "n2", 8, min_runtime_s=60)]}
    nodes = [("n0", 8, 8), ("n1", 8, 0), ("n2", 8, 0)]
    assert ids(plan_preemption(GANG, nodes, on, RANK, NOW)) == (("n0", "n1"), ["free"])


def test_a_gang_that_fits_free_nodes_already_needs_no_plan() -> None:
    nodes = [("n0", 8, 8), ("n1", 8, 8), ("n2", 8, 0)]
    on = {"n2": [run("free", "n2", 8)]}
    assert plan_preemption(GANG, nodes, on, RANK, NOW) is None


def test_a_node_with_gpus_held_by_something_unlisted_is_not_freed_for_a_gang() -> None:
    # n1 has 4 GPUs held by work that is not a candidate victim (another gang, a stopping job).
    on = {"n0": [run("free-0", "n0", 8)], "n1": [run("free-1", "n1", 4)]}
    nodes = [("n0", 8, 0), ("n1", 8, 0)]
    assert plan_preemption(GANG, nodes, on, RANK, NOW) is None


def test_a_gang_never_takes_a_node_with_any_protected_job() -> None:
    on = {
        "n0": [run("free-0", "n0", 8)],
        "n1": [run("free-1", "n1", 4), run("young", "n1", 4, min_runtime_s=600, started_at=NOW)],
    }
    assert plan_preemption(GANG, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW) is None


def gang_on(nodes: tuple[str, ...], *, resumable: bool, started_at: float = 0.0) -> RunningJob:
    """A running gang of 8 GPUs per node, as preemption sees it on the first node."""
    spec = job(8 * len(nodes), allocation="third", min_runtime_s=60, resumable=resumable)
    return RunningJob("gang", spec, nodes[0], 8, started_at, False, 1, 60.0)


def test_a_running_gang_is_stopped_whole_and_frees_every_node_it_spans() -> None:
    gang = gang_on(("n0", "n1"), resumable=True)
    on = {
        "n0": [gang],
        "n1": [RunningJob("gang", gang.spec, "n1", 8, 0.0, False, 1, 60.0)],
        "n2": [run("a", "n2", 4, allocation="second"), run("b", "n2", 4, allocation="second")],
    }
    nodes = [("n0", 8, 0), ("n1", 8, 0), ("n2", 8, 0)]
    # One job stopped (not three) and no work lost: the gang's two nodes.
    assert ids(plan_preemption(GANG, nodes, on, RANK, NOW)) == (("n0", "n1"), ["gang"])


def test_a_lossless_plan_leaves_work_that_cannot_resume_a_lossy_one_takes_it() -> None:
    on = {"n0": [run("old", "n0", 8)]}  # free work, 10 hours in, cannot resume
    assert plan_preemption(WAITING, [("n0", 8, 0)], on, RANK, NOW, lossless=True) is None
    assert ids(plan_preemption(WAITING, [("n0", 8, 0)], on, RANK, NOW)) == (("n0",), ["old"])


def test_a_lossy_plan_throws_away_at_most_the_cap_per_gpu_of_the_waiting_job() -> None:
    on = {"n0": [run("old", "n0", 8)]}  # 10 hours of 8 GPUs: 80 GPU-hours
    nodes = [("n0", 8, 0)]
    assert plan_preemption(WAITING, nodes, on, RANK, NOW, loss_cap_s=20 * HOUR) is not None
    assert plan_preemption(WAITING, nodes, on, RANK, NOW, loss_cap_s=19 * HOUR) is None


def test_the_cap_bounds_the_work_a_plan_throws_away_in_all_not_per_victim() -> None:
    # Two jobs that cannot resume, 8 hours of 2 GPUs each: 16 GPU-hours apiece, 32 in all.
    on = {"n0": [run(v, "n0", 2, started_at=NOW - 8 * HOUR) for v in ("a", "b")]}
    nodes = [("n0", 4, 0)]
    # 6 hours of the waiting job's 4 GPUs (24 GPU-hours) covers either victim, not both.
    assert plan_preemption(WAITING, nodes, on, RANK, NOW, loss_cap_s=6 * HOUR) is None
    assert ids(plan_preemption(WAITING, nodes, on, RANK, NOW, loss_cap_s=8 * HOUR)) == (
        ("n0",),
        ["a", "b"],
    )


def test_a_gangs_plan_throws_away_at_most_the_cap_over_all_its_nodes() -> None:
    gang = job(16, allocation="first", min_runtime_s=3600)
    # One job that cannot resume per node, an hour of 8 GPUs each: 16 GPU-hours in all.
    on = {n: [run(f"on-{n}", n, 8, started_at=NOW - HOUR)] for n in ("n0", "n1")}
    nodes = [("n0", 8, 0), ("n1", 8, 0)]
    assert plan_preemption(gang, nodes, on, RANK, NOW, loss_cap_s=HOUR / 2) is None
    plan = plan_preemption(gang, nodes, on, RANK, NOW, loss_cap_s=HOUR)
    assert ids(plan) == (("n0", "n1"), ["on-n0", "on-n1"])


def test_plans_throw_away_the_least_work() -> None:
    resumes = job(4, allocation="second", min_runtime_s=60, resumable=True)
    on = {
        "n0": [run("old", "n0", 4)],  # free work that cannot resume: the cheaper, once
        "n1": [RunningJob("paid-resumes", resumes, "n1", 4, 0.0, False, 2, 60.0)],
    }
    nodes = [("n0", 4, 0), ("n1", 4, 0)]
    assert ids(plan_preemption(WAITING, nodes, on, RANK, NOW)) == (("n1",), ["paid-resumes"])


def test_no_plan_throws_away_a_gangs_work() -> None:
    for started_at in (0.0, NOW - 60):  # ten hours in, or a minute
        gang = gang_on(("n0", "n1"), resumable=False, started_at=started_at)
        on = {
            node: [RunningJob("gang", gang.spec, node, 8, started_at, False, 1, 60.0)]
            for node in ("n0", "n1")
        }
        assert plan_preemption(GANG, [("n0", 8, 0), ("n1", 8, 0)], on, RANK, NOW) is None


# -- properties ----------------------------------------------------------------


@st.composite
def clusters(
    draw: st.DrawFn,
) -> tuple[JobSpec, list[tuple[str, int, int]], dict[str, list[RunningJob]], float]:
    nodes: list[tuple[str, int, int]] = []
    on: dict[str, list[RunningJob]] = {}
    seq = 0
    for n in range(draw(st.integers(1, 4))):
        node_id = f"n{n}"
        room = 8
        jobs = []
        while room and draw(st.booleans()):
            gpus = draw(st.integers(1, room))
            seq += 1
            jobs.append(
                run(
                    f"j{seq}",
                    node_id,
                    gpus,
                    allocation=draw(st.sampled_from(["first", "second", "third"])),
                    min_runtime_s=draw(st.sampled_from([0, 600, 3600])),
                    started_at=draw(st.sampled_from([None, 0.0, 1000.0, 3000.0])),
                    idle=draw(st.booleans()),
                    seq=seq,
                    resumable=draw(st.booleans()),
                )
            )
            room -= gpus
        nodes.append((node_id, 8, room))
        on[node_id] = jobs
    waiting = job(
        draw(st.sampled_from([1, 2, 4, 8, 16])),
        allocation=draw(st.sampled_from(["first", "second", "third"])),
        min_runtime_s=draw(st.sampled_from([0, 600, 3600])),
    )
    return waiting, nodes, on, draw(st.sampled_from([0.0, 1000.0, 3600.0, 4000.0]))


@given(clusters())
def test_a_plan_frees_enough_room_and_never_touches_protected_work(
    case: tuple[JobSpec, list[tuple[str, int, int]], dict[str, list[RunningJob]], float],
) -> None:
    waiting, nodes, on, now = case
    plan = plan_preemption(waiting, nodes, on, RANK, now)
    if plan is None:
        return
    assert waiting.allocated
    assert plan.victims
    for victim in plan.victims:
        assert not victim.protected(now)
        assert victim.node_id in plan.node_ids
    free = {node_id: room for node_id, _, room in nodes}
    freed = sum(free[n] for n in plan.node_ids) + sum(v.gpus for v in plan.victims)
    assert freed >= waiting.gpus
    assert list(plan.node_ids) == sorted(set(plan.node_ids))


@given(clusters(), st.sampled_from([0.0, 600.0, 3600.0]))
def test_a_plan_never_throws_away_more_than_its_cap_in_all(
    case: tuple[JobSpec, list[tuple[str, int, int]], dict[str, list[RunningJob]], float],
    loss_cap_s: float,
) -> None:
    waiting, nodes, on, now = case
    plan = plan_preemption(waiting, nodes, on, RANK, now, loss_cap_s=loss_cap_s)
    if plan is not None:
        lost = sum({v.job_id: v.lost_gpu_s(now) for v in plan.victims}.values())
        assert lost <= loss_cap_s * waiting.gpus


def random_cluster(
    rng: random.Random,
) -> tuple[JobSpec, list[tuple[str, int, int]], dict[str, list[RunningJob]], float]:
    """Up to 8 nodes of mixed work: free and charged, resumable or not, idle or busy."""
    nodes: list[tuple[str, int, int]] = []
    on: dict[str, list[RunningJob]] = {}
    for n in range(rng.randint(1, 8)):
        node_id, room, jobs = f"n{n}", 8, []
        while room and rng.random() < 0.6:
            gpus = rng.randint(1, room)
            jobs.append(
                run(
                    f"j{n}.{len(jobs)}",
                    node_id,
                    gpus,
                    allocation=rng.choice(list(RANK)),
                    min_runtime_s=rng.choice([0, 600, 3600]),
                    started_at=rng.choice([None, 0.0, 1000.0, 3000.0]),
                    idle=rng.random() < 0.5,
                    seq=rng.randint(1, 99),
                    resumable=rng.random() < 0.5,
                )
            )
            room -= gpus
        nodes.append((node_id, 8, room))
        on[node_id] = jobs
    waiting = job(rng.choice([1, 2, 4, 8]), allocation=rng.choice(list(RANK)), min_runtime_s=600)
    return waiting, nodes, on, rng.choice([0.0, 1000.0, 3600.0, 4000.0])


def test_a_plan_reading_only_the_nodes_with_room_in_order_is_each_nodes_best() -> None:
    """As ``Reservations`` plans: nodes short of room left out, the rest by free GPUs
    (most first) then id, read only until no node further on can cost less. The plan
    is the cheapest of the plans each node alone gives (cost, then node id)."""
    rng = random.Random(7)
    for _ in range(2000):
        waiting, nodes, on, now = random_cluster(rng)
        rooms = {node_id: room_of(jobs) for node_id, jobs in on.items()}
        for lossless, cap in ((True, 0.0), (False, 3600.0)):
            bounds = {n: bound(rooms[n], now, lossless=lossless) for n, _, _ in nodes}
            room = bounds.__getitem__

            alone = [
                plan
                for node in nodes
                if (
                    plan := plan_preemption(
                        waiting, [node], on, RANK, now, lossless=lossless, loss_cap_s=cap
                    )
                )
            ]
            cheapest = min(alone, key=lambda p: (_cost(p.victims, now), p.node_ids), default=None)
            assert ids(
                plan_preemption(
                    waiting, nodes[::-1], on, RANK, now, lossless=lossless, loss_cap_s=cap
                )
            ) == ids(cheapest)
            read = sorted(
                ((-free, n, size) for n, size, free in nodes if free + room(n) >= waiting.gpus),
            )
            plan = plan_preemption(
                waiting,
                iter([(n, size, -free) for free, n, size in read]),
                on,
                RANK,
                now,
                lossless=lossless,
                loss_cap_s=cap,
                room_bound=room,
                node_size=8,
                ordered=True,
            )
            assert ids(plan) == ids(cheapest)
