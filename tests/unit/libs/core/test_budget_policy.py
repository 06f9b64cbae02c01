"""Fair share, the contract and preemption: scenario by scenario."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from libs.core import (
    BudgetSet,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    JobSpec,
    NodeJoined,
    Place,
    Preempted,
    Preemption,
    PreemptionRule,
    Protection,
    Requeue,
    Scheduler,
    Stop,
    StopCause,
    TaskEnded,
    TaskIdle,
    TaskStarted,
    Tick,
    UsageSnapshot,
    Wait,
)
from libs.core.config import PolicyConfig
from libs.core.contract import RECLAIM_TURN_S
from libs.core.decisions import stop_grace
from libs.core.fairshare import leaf_order
from libs.core.reservations import PREEMPTION_ROUND_S
from tests.builders import job, node, tree

HOUR = 3600.0


def run_job(s: Scheduler, at: float, job_id: str, spec: JobSpec) -> None:
    """Submit a job and report every task placed on its arrival as started, as node agents
    would."""
    for d in s.handle(JobArrived(at, job_id, spec)):
        if isinstance(d, Place):
            s.handle(TaskStarted(at, d.job_id, d.task_id, d.node_id))


def charged(s: Scheduler, **gpu_s: float) -> None:
    """Usage over the week so far, by allocation."""
    s.handle(UsageSnapshot(0, 7 * 24 * HOUR, tuple(gpu_s.items())))


def cluster(*nodes: int, **weights: float) -> Scheduler:
    s = Scheduler()
    s.handle(BudgetSet(0, tree(**weights)))
    for i, gpus in enumerate(nodes):
        s.handle(NodeJoined(0, node(f"n{i}", gpus)))
    return s


def placed(decisions: list[Decision]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Place)]


def stopped(decisions: list[Decision]) -> list[str]:
    return sorted({d.job_id for d in decisions if isinstance(d, Stop)})


def test_siblings_are_ordered_by_usage_over_share() -> None:
    t = tree(a=1, b=1, c=2)
    assert leaf_order(t, {"a": 10, "b": 5, "c": 12}) == ["b", "c", "a"]


def test_the_under_served_allocation_goes_first() -> None:
    s = cluster(1, a=1, b=1)
    charged(s, a=100.0, b=10.0)
    run_job(s, 1, "filler", job(1, allocation="a", min_runtime_s=60))
    s.handle(JobArrived(2, "a-job", job(1, allocation="a", min_runtime_s=60)))
    s.handle(JobArrived(3, "b-job", job(1, allocation="b", min_runtime_s=60)))
    assert placed(s.handle(TaskEnded(4, "filler", "filler/0", "n0"))) == ["b-job"]


def test_priority_orders_jobs_only_inside_one_allocation() -> None:
    s = cluster(1, a=1, b=1)
    run_job(s, 0, "filler", job(1, allocation="a", min_runtime_s=60))
    s.handle(JobArrived(1, "low", job(1, allocation="b", priority=0, min_runtime_s=60)))
    s.handle(JobArrived(2, "high", job(1, allocation="b", priority=5, min_runtime_s=60)))
    assert placed(s.handle(TaskEnded(3, "filler", "filler/0", "n0"))) == ["high"]


def test_best_fit_keeps_large_blocks_whole() -> None:
    s = cluster(8, 2, a=1)
    d = s.handle(JobArrived(0, "small", job(2, allocation="a", min_runtime_s=60)))
    assert [(p.node_id, p.gpu_indices) for p in d if isinstance(p, Place)] == [("n1", (0, 1))]
    assert placed(s.handle(JobArrived(1, "big", job(8, allocation="a", min_runtime_s=60)))) == [
        "big"
    ]


def test_a_gang_takes_whole_nodes_all_or_nothing() -> None:
    s = cluster(8, 8, 8, a=1)
    s.handle(JobArrived(0, "one", job(1, allocation="a", min_runtime_s=60)))
    d = s.handle(JobArrived(1, "gang", job(16, allocation="a", min_runtime_s=60)))
    assert sorted((p.node_id, len(p.gpu_indices)) for p in d if isinstance(p, Place)) == [
        ("n1", 8),
        ("n2", 8),
    ]
    [wait] = s.handle(JobArrived(2, "gang2", job(16, allocation="a", min_runtime_s=60)))
    assert isinstance(wait, Wait) and "on 2 whole nodes; waiting for them" in wait.reason
    assert "2 whole nodes; 0 are free" in (s.explain("gang2") or _none()).text


def test_memory_per_gpu_is_a_constraint() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("small")))
    [wait] = s.handle(JobArrived(1, "j", job(1, min_gpu_memory_gib=80)))
    assert isinstance(wait, Wait) and "≥80 GiB" in wait.reason


def test_free_work_fills_idle_gpus_and_yields_to_allocated_work() -> None:
    s = cluster(2, a=1)
    run_job(s, 0, "free", job(2, allocation="a", min_runtime_s=0, resumable=True))
    s.handle(JobArrived(1, "paid", job(2, allocation="a", min_runtime_s=HOUR)))
    d = s.handle(Tick(PREEMPTION_ROUND_S))  # preemption runs in rounds
    [stop] = [x for x in d if isinstance(x, Stop)]
    assert (stop.job_id, stop.cause) == ("free", StopCause.PREEMPTED)
    assert stop.grace_s == PolicyConfig().free_stop_grace_s == 5.0  # preemptible at any moment
    d = s.handle(TaskEnded(2, "free", stop.task_id, "n0", exit_code=-15))
    assert [type(x) for x in d] == [Requeue, Place, Wait]
    assert placed(d) == ["paid"]


@pytest.mark.parametrize(
    ("asked_s", "granted_s"),
    [(5.0, 5.0), (60.0, 30.0), (0.0, 30.0), (-1.0, 30.0), (math.nan, 30.0), (math.inf, 30.0)],
)
def test_a_stop_may_shorten_the_agents_grace_never_lengthen_it(
    asked_s: float, granted_s: float
) -> None:
    assert stop_grace(asked_s, 30.0) == granted_s  # what a node agent and the simulator do


def test_charged_work_and_cancelled_free_work_keep_the_agents_grace() -> None:
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-job", job(2, allocation="b", min_runtime_s=60, resumable=True))
    d = s.handle(JobArrived(HOUR, "a-job", job(2, allocation="a", min_runtime_s=HOUR)))
    assert [(x.job_id, x.grace_s) for x in d if isinstance(x, Stop)] == [("b-job", 0.0)]
    s2 = cluster(2, a=1)
    run_job(s2, 0, "free", job(2, allocation="a", min_runtime_s=0))
    d = s2.handle(CancelRequested(1, "free"))
    assert [(x.job_id, x.cause, x.grace_s) for x in d if isinstance(x, Stop)] == [
        ("free", StopCause.CANCELLED, 0.0)
    ]


def test_protected_work_is_never_preempted() -> None:
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-job", job(1, allocation="b", min_runtime_s=HOUR))  # b's share: 1 GPU
    run_job(s, 0, "a-first", job(1, allocation="a", min_runtime_s=HOUR))
    # a's job is sure to do 2 hours: it may throw away b's hour of work that cannot resume.
    d = s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=2 * HOUR)))
    assert not any(isinstance(x, Stop) for x in d)
    # Past its contract, the over-served allocation's job yields.
    d = s.handle(Tick(HOUR + 61))
    assert [(x.job_id, x.cause) for x in d if isinstance(x, Stop)] == [
        ("b-job", StopCause.PREEMPTED)
    ]
    d = s.handle(TaskEnded(HOUR + 70, "b-job", "b-job/0", "n0"))
    assert isinstance(d[0], Preempted) and placed(d) == ["a-job"]


def over_share() -> Scheduler:
    """b's work fills the node, twice its share; a (below its share) waits for it."""
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-mine", job(1, allocation="b", min_runtime_s=HOUR, resumable=True))
    run_job(s, 0, "b-borrowed", job(1, allocation="b", min_runtime_s=HOUR, resumable=True))
    return s


def test_work_placed_beyond_its_share_is_taken_back_inside_its_minimum_runtime() -> None:
    s = over_share()
    d = s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=HOUR)))
    assert stopped(d) == ["b-borrowed"]  # not b-mine: within b's share, it is protected
    assert placed(s.handle(TaskEnded(20, "b-borrowed", "b-borrowed/0", "n0"))) == ["a-job"]


def test_a_job_that_would_borrow_itself_takes_borrowed_gpus_back_after_a_turn() -> None:
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-wide", job(2, allocation="b", min_runtime_s=HOUR, resumable=True))
    d = s.handle(JobArrived(10, "a-wide", job(2, allocation="a", min_runtime_s=HOUR)))
    assert stopped(d) == []  # a's 2 GPUs would be beyond its share of 1, as b's are
    assert stopped(s.handle(Tick(RECLAIM_TURN_S - 1))) == []
    assert stopped(s.handle(Tick(RECLAIM_TURN_S + PREEMPTION_ROUND_S))) == ["b-wide"]  # its turn
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-wide", job(2, allocation="b", min_runtime_s=HOUR, resumable=True))
    d = s.handle(JobArrived(10, "a-one", job(1, allocation="a", min_runtime_s=HOUR)))
    assert stopped(d) == ["b-wide"]  # within a's share: it takes back what b borrowed


def test_two_jobs_wider_than_their_teams_shares_take_turns_not_a_stop_each_round() -> None:
    # Each runs beyond its team's share. Taking the node back whenever the other ranked
    # below would stop one of them every preemption round, for ever.
    s = cluster(2, a=1, b=1)
    run_job(s, 0, "b-wide", job(2, allocation="b", min_runtime_s=HOUR, resumable=True))
    wide = job(2, allocation="a", min_runtime_s=HOUR, resumable=True)
    inputs: list[Input] = [JobArrived(10, "a-wide", wide)]
    stops: list[float] = []
    at = 10.0
    while at < 3 * HOUR:
        for d in s.handle(inputs.pop(0) if inputs else Tick(at := at + 15)):
            if isinstance(d, Stop):
                stops.append(at)
                inputs.append(TaskEnded(at + 1, d.job_id, d.task_id, d.node_id))
            elif isinstance(d, Place):
                inputs.append(TaskStarted(at + 1, d.job_id, d.task_id, d.node_id))
    assert len(stops) >= 3  # they do share the node
    assert all(later - earlier >= RECLAIM_TURN_S for earlier, later in pairwise(stops))


def test_the_policy_may_protect_borrowed_work_too() -> None:
    s = Scheduler(PolicyConfig(protect_borrowed=True))
    s.handle(BudgetSet(0, tree(a=1, b=1)))
    s.handle(NodeJoined(0, node("n0", 2)))
    charged(s, a=0.0, b=1e9)
    for job_id in ("b-mine", "b-borrowed"):
        run_job(s, 0, job_id, job(1, allocation="b", min_runtime_s=HOUR, resumable=True))
    assert (
        stopped(s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=HOUR)))) == []
    )
    assert stopped(s.handle(Tick(HOUR + 1))) == ["b-borrowed"]  # past its contract


def test_past_contract_work_keeps_running_while_its_allocation_ranks_above() -> None:
    s = cluster(1, a=1, b=1)
    charged(s, a=1e9, b=0.0)
    run_job(s, 0, "b-job", job(1, allocation="b", min_runtime_s=60))
    s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=60)))
    assert not any(isinstance(x, Stop) for x in s.handle(Tick(HOUR)))


def test_victims_are_free_work_then_idle_then_fewest_gpus() -> None:
    s = cluster(4, 4, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    for name, gpus, minimum in [
        ("b-big", 3, 60),
        ("b-small", 1, 60),
        ("b-idle", 2, 60),
        ("free", 2, 0),
    ]:
        run_job(s, 0, name, job(gpus, allocation="b", min_runtime_s=minimum))
    s.handle(TaskIdle(10, "b-idle", "b-idle/0", True))
    # Sure to do 8 hours on 4 GPUs, a's job may throw away an hour of 4 GPUs' work.
    d = s.handle(JobArrived(HOUR, "a-job", job(4, allocation="a", min_runtime_s=8 * HOUR)))
    assert sorted(x.job_id for x in d if isinstance(x, Stop)) == ["b-idle", "free"]


def test_debug_work_takes_the_fast_path() -> None:
    s = cluster(1, a=1, b=1)
    charged(s, a=1e9, b=0.0)
    run_job(s, 0, "b-train", job(1, allocation="b", min_runtime_s=8 * HOUR))
    s.handle(JobArrived(1, "b-more", job(1, allocation="b", min_runtime_s=8 * HOUR)))
    s.handle(JobArrived(2, "a-debug", job(1, allocation="a", min_runtime_s=600)))
    assert placed(s.handle(TaskEnded(3, "b-train", "b-train/0", "n0"))) == ["a-debug"]


def test_explanations_name_rank_ratio_and_queue_position() -> None:
    s = cluster(2, a=1, b=1)
    charged(s, a=3e5, b=1e5)
    run_job(s, 0, "fill", job(2, allocation="b", min_runtime_s=HOUR))
    s.handle(JobArrived(1, "b1", job(2, allocation="b", min_runtime_s=HOUR)))
    s.handle(JobArrived(2, "a1", job(2, allocation="a", min_runtime_s=HOUR)))
    why = s.explain("a1")
    assert why is not None and why.waiting and why.jobs_ahead == 1
    assert "a ranks 2 of 2 by fair share" in why.text
    assert "needs 2×GPU on one node; the largest free block is 0" in why.text
    running = s.explain("fill")  # 2 GPUs, b's share is 1
    assert running is not None and "on GPUs borrowed beyond b's share" in running.text


def _none() -> object:
    raise AssertionError("no explanation")


def test_a_job_no_node_can_hold_never_preempts_anything() -> None:
    s = cluster(2, a=1)
    run_job(s, 0, "free", job(2, allocation="a", min_runtime_s=0))
    s.handle(JobArrived(1, "h200", job(1, allocation="a", gpu_type="H200", min_runtime_s=60)))
    assert not any(isinstance(d, Stop) for d in s.handle(Tick(PREEMPTION_ROUND_S + 1)))


def test_the_debug_headroom_never_idles_gpus_nobody_else_wants() -> None:
    s = cluster(8, 8, 8, 8, a=1)
    for i in range(4):
        d = s.handle(JobArrived(i, f"j{i}", job(8, allocation="a", min_runtime_s=HOUR)))
        assert placed(d) == [f"j{i}"]


# --- what a job is told: how it is protected, and who preempted it by which rule ----


def stops(decisions: list[Decision]) -> dict[str, Preemption | None]:
    return {d.job_id: d.preemption for d in decisions if isinstance(d, Stop)}


def protections(decisions: list[Decision]) -> list[tuple[str, Protection | None, float]]:
    return [(d.job_id, d.protection, d.protected_s) for d in decisions if isinstance(d, Place)]


def test_each_placement_says_how_the_job_is_protected() -> None:
    s = cluster(4, a=1, b=1)
    capped = PolicyConfig().max_min_runtime_s
    assert protections(s.handle(JobArrived(1, "free", job(1, allocation="a")))) == [
        ("free", Protection.FREE, 0.0)
    ]
    mine = s.handle(JobArrived(2, "mine", job(2, allocation="a", min_runtime_s=100 * HOUR)))
    assert protections(mine) == [("mine", Protection.CONTRACT, capped)]  # within the cap
    beyond = s.handle(JobArrived(3, "beyond", job(1, allocation="a", min_runtime_s=HOUR * 2)))
    assert protections(beyond) == [("beyond", Protection.BORROWED, 0.0)]  # past a's 2 GPUs


def test_free_work_is_told_it_yielded_to_whom() -> None:
    s = cluster(2, a=1)
    run_job(s, 0, "free", job(2, allocation="a", min_runtime_s=0, resumable=True))
    s.handle(JobArrived(1, "paid", job(2, allocation="a", min_runtime_s=HOUR)))
    d = s.handle(Tick(PREEMPTION_ROUND_S))
    assert stops(d) == {"free": Preemption("paid", "a", PreemptionRule.FREE_WORK)}
    [stop] = [x for x in d if isinstance(x, Stop)]
    assert stop.reason == "preempted for paid of a: free work yields its GPUs to charged work"
    [requeue] = [
        x for x in s.handle(TaskEnded(2, "free", "free/0", "n0")) if isinstance(x, Requeue)
    ]
    assert requeue.reason == f"{stop.reason}; requeued (resumable)"


def test_borrowed_work_is_told_its_gpus_were_taken_back() -> None:
    s = over_share()
    d = s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=HOUR)))
    assert stops(d) == {"b-borrowed": Preemption("a-job", "a", PreemptionRule.BORROWED)}


def test_work_past_its_contract_is_told_it_ended() -> None:
    s = cluster(2, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(s, 0, "b-job", job(1, allocation="b", min_runtime_s=HOUR))
    run_job(s, 0, "a-first", job(1, allocation="a", min_runtime_s=HOUR))
    s.handle(JobArrived(10, "a-job", job(1, allocation="a", min_runtime_s=2 * HOUR)))
    d = s.handle(Tick(HOUR + 61))
    assert stops(d) == {"b-job": Preemption("a-job", "a", PreemptionRule.CONTRACT_ENDED)}
    [ended] = [
        x
        for x in s.handle(TaskEnded(HOUR + 70, "b-job", "b-job/0", "n0"))
        if isinstance(x, Preempted)
    ]
    assert ended.reason.startswith("preempted for a-job of a: past its minimum runtime")
    assert ended.reason.endswith("; not resumable")
