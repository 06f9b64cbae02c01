"""Teams and contracts: reproducible across runs and machines, and following the rules."""

from __future__ import annotations

import pytest

from libs.core.budget_tree import BudgetNode, BudgetTree
from libs.core.limits import MAX_RUNTIME_ESTIMATE_S
from libs.core.model import WorkClass
from libs.sim.mapping import (
    ContractRules,
    Teams,
    contract_of,
    stable_fraction,
    team_of,
    to_sim_jobs,
)
from libs.sim.traces import RawJob, TraceError

TEAMS = ["ads", "infra", "language", "ranking", "reliability", "speech", "vision"]
BY_HASH = Teams(tuple(TEAMS))
CAP = 8 * 3600.0


def test_the_hash_is_pinned_so_that_reports_stay_comparable() -> None:
    # SHA-256 based: the same on every machine and Python version (never ``hash``).
    assert stable_fraction("qm-sim", "team", "user-1") == pytest.approx(0.40729010857109404)
    assert {u: team_of(f"user-{u}", TEAMS, "qm-sim") for u in (1, 2, 3, 136)} == {
        1: "language",
        2: "reliability",
        3: "speech",
        136: "ads",
    }


def test_every_job_of_a_user_lands_in_one_team_whatever_the_order() -> None:
    jobs = [RawJob(f"j{i}", float(i), f"user-{i % 5}", 1, 7200.0) for i in range(50)]
    forward = to_sim_jobs(jobs, BY_HASH, ContractRules(), CAP)
    backward = to_sim_jobs(list(reversed(jobs)), BY_HASH, ContractRules(), CAP)
    teams = {j.spec.user: j.spec.allocation for j in forward}
    assert all(teams[j.spec.user] == j.spec.allocation for j in forward + backward)
    assert {j.job_id: j.spec for j in forward} == {j.job_id: j.spec for j in backward}


def test_a_different_seed_reshuffles_teams() -> None:
    users = [f"user-{u}" for u in range(40)]
    a = [team_of(u, TEAMS, "qm-sim") for u in users]
    b = [team_of(u, TEAMS, "other") for u in users]
    assert a != b


@pytest.mark.parametrize(
    ("job", "min_runtime", "work_class"),
    [
        (RawJob("d", 0, "u", 2, 600.0), 600, WorkClass.DEBUG),
        (RawJob("d2", 0, "u", 1, 1700.0), 900, WorkClass.DEBUG),  # capped at 15 min
        (RawJob("big", 0, "u", 4, 600.0, best_effort=False), 600, WorkClass.ALLOCATED),
        (RawJob("long", 0, "u", 8, 90_000.0, best_effort=False), 28_800, WorkClass.ALLOCATED),
        (RawJob("be", 0, "u", 1, 60.0, best_effort=True), 0, WorkClass.UNALLOCATED),
    ],
)
def test_contract_rules(job: RawJob, min_runtime: int, work_class: WorkClass) -> None:
    (sim,) = to_sim_jobs([job], BY_HASH, ContractRules(), CAP)
    assert sim.spec.min_runtime_s == min_runtime
    assert sim.spec.work_class is work_class
    assert sim.runtime_s == job.runtime_s


def test_hash_drawn_shares_come_out_near_the_configured_shares() -> None:
    rules = ContractRules(unallocated_share=0.25, resumable_share=0.6)
    jobs = [RawJob(f"j{i}", 0.0, "u", 8, 7200.0) for i in range(4000)]
    contracts = [contract_of(j, rules, CAP) for j in jobs]
    assert sum(c.min_runtime_s == 0 for c in contracts) / 4000 == pytest.approx(0.25, abs=0.03)
    assert sum(c.resumable for c in contracts) / 4000 == pytest.approx(0.6, abs=0.03)
    priorities = [c.priority for c in contracts]
    assert priorities.count(1) / 4000 == pytest.approx(0.5, abs=0.03)  # inflation: mostly HIGH


def test_a_trace_that_states_priority_keeps_it() -> None:
    job = RawJob("p", 0.0, "u", 1, 60.0, best_effort=False, priority=2)
    assert contract_of(job, ContractRules(), CAP).priority == 2


def test_the_requested_limit_is_the_jobs_runtime_estimate() -> None:
    asked = RawJob("a", 0.0, "u", 1, 60.0, requested_s=3600.0)
    absurd = RawJob("b", 0.0, "u", 1, 60.0, requested_s=1e12)
    sims = to_sim_jobs(
        [asked, absurd, RawJob("c", 0.0, "u", 1, 60.0)], BY_HASH, ContractRules(), CAP
    )
    assert [s.spec.runtime_estimate_s for s in sims] == [3600.0, MAX_RUNTIME_ESTIMATE_S, 0.0]


def test_a_named_team_wins_then_the_trees_members_then_the_hash() -> None:
    tree = BudgetTree(
        (
            BudgetNode("org"),
            BudgetNode("vision", "org", members=("alice", "bob")),
            BudgetNode("speech", "org", members=("bob",)),  # bob's first leaf by name wins
            BudgetNode("ads", "org"),
        )
    )
    teams = Teams.of(tree)
    jobs = [
        RawJob("1", 0.0, "alice", 1, 60.0, team="ads"),  # the trace's word wins
        RawJob("2", 0.0, "alice", 1, 60.0),
        RawJob("3", 0.0, "bob", 1, 60.0),
        RawJob("4", 0.0, "carol", 1, 60.0),  # in no leaf's members: hashed
    ]
    assert [teams.named(j) for j in jobs] == ["ads", "vision", "speech", None]
    sims = to_sim_jobs(jobs, teams, ContractRules(), CAP)
    assert sims[3].spec.allocation == team_of("carol", ["ads", "speech", "vision"], "qm-sim")
    with pytest.raises(TraceError, match="job 5: team 'nobody' is not a budget-tree leaf"):
        teams.named(RawJob("5", 0.0, "alice", 1, 60.0, team="nobody"))
