"""Explanations (``libs/core/explain.py``): what ``qm why`` says, word for word."""

from __future__ import annotations

from libs.core import (
    BudgetSet,
    JobArrived,
    NodeJoined,
    Scheduler,
    StopCause,
    TaskEnded,
    TaskStarted,
    Tick,
)
from libs.core.config import PolicyConfig
from libs.core.explain import explain_running, explain_serving, explain_waiting
from libs.core.fairshare import Standing
from libs.core.queues import Waiting
from tests.builders import job, node, tree

FIRST = Standing(rank=1, of=3, ratio=0.5)


def pending(min_runtime_s: int = 0) -> Waiting:
    return Waiting("j1", job(4, min_runtime_s=min_runtime_s), seq=1, attempt=0, since=0.0)


def test_a_waiting_job_hears_the_reason_its_standing_and_the_jobs_ahead() -> None:
    why = explain_waiting(
        pending(min_runtime_s=3600),
        FIRST,
        reason="needs 4×H100 on one node; the largest free block is 2",
        ahead=3,
        reserved=None,
    )
    assert why.text == (
        "needs 4×H100 on one node; the largest free block is 2; "
        "team-a ranks 1 of 3 by fair share (usage/entitlement 0.50); 3 jobs ahead of it"
    )
    assert (why.job_id, why.waiting, why.allocation, why.jobs_ahead) == ("j1", True, "team-a", 3)
    assert why.standing == FIRST


def test_one_job_ahead_is_singular() -> None:
    why = explain_waiting(pending(min_runtime_s=60), FIRST, reason="r", ahead=1, reserved=None)
    assert why.text.endswith("; 1 job ahead of it")
    why = explain_waiting(pending(min_runtime_s=60), FIRST, reason="r", ahead=0, reserved=None)
    assert why.text.endswith("; 0 jobs ahead of it")


def test_free_work_is_told_it_runs_only_on_idle_gpus() -> None:
    why = explain_waiting(pending(), FIRST, reason="r", ahead=0, reserved=None)
    assert why.text.endswith("; free work runs only on otherwise idle GPUs")


def test_nodes_reserved_for_a_job_are_named() -> None:
    one = explain_waiting(pending(min_runtime_s=60), FIRST, reason="r", ahead=0, reserved=("n1",))
    assert "; n1 is reserved for it while preempted work stops; " in one.text
    two = explain_waiting(
        pending(min_runtime_s=60), FIRST, reason="r", ahead=0, reserved=("n1", "n2")
    )
    assert "; n1, n2 are reserved for it while preempted work stops; " in two.text


def test_an_allocation_outside_the_budget_tree_is_said_so() -> None:
    why = explain_waiting(pending(min_runtime_s=60), None, reason="r", ahead=0, reserved=None)
    assert why.text == "r; team-a is not in the budget tree; 0 jobs ahead of it"


def test_running_work_says_how_long_its_contract_still_protects_it() -> None:
    why = explain_running(
        "j1", "team-a", FIRST, nodes=["n0", "n1"], protected_until=1000.0, now=400.4, stopping=None
    )
    assert why.text == (
        "running on n0, n1; protected by its contract for 600 s more; "
        "team-a ranks 1 of 3 by fair share (usage/entitlement 0.50)"
    )
    assert not why.waiting


def test_running_work_past_its_contract_is_preemptible() -> None:
    for protected_until in (None, 1000.0):  # no contract clock, or a contract already met
        why = explain_running(
            "j1",
            "a",
            None,
            nodes=["n0"],
            protected_until=protected_until,
            now=1000.0,
            stopping=None,
        )
        assert why.text == (
            "running on n0; past its minimum runtime: preemptible when higher-ranked work "
            "waits; a is not in the budget tree"
        )


def test_work_being_stopped_says_why_whatever_its_contract() -> None:
    why = explain_running(
        "j1",
        "a",
        None,
        nodes=["n0"],
        protected_until=5000.0,
        now=1000.0,
        stopping=StopCause.PREEMPTED,
    )
    assert why.text.startswith("running on n0; being stopped (preempted); ")


def test_a_workflow_is_explained_by_what_it_does() -> None:
    why = explain_serving("w1", "team-a", FIRST, "3 of 5 tasks done", waiting=False)
    assert why.text == (
        "3 of 5 tasks done; team-a ranks 1 of 3 by fair share (usage/entitlement 0.50)"
    )
    assert (why.waiting, why.jobs_ahead) == (False, 0)


# -- through the scheduler -----------------------------------------------------


def busy_cluster() -> Scheduler:
    """team-b's 8-GPU job fills the only node; team-a's jobs wait behind it. Its minimum
    runtime protects it beyond team-b's share too (``protect_borrowed``); past it, a job
    of team-a, sure to do 3 hours on 4 GPUs, may throw away an hour of its work."""
    s = Scheduler(PolicyConfig(protect_borrowed=True))
    s.handle(BudgetSet(0, tree(**{"team-a": 3, "team-b": 1})))
    s.handle(NodeJoined(0, node("n0", 8)))
    s.handle(JobArrived(0, "big", job(8, allocation="team-b", min_runtime_s=3600)))
    s.handle(TaskStarted(0, "big", "big/0", "n0"))
    s.handle(JobArrived(10, "a1", job(4, allocation="team-a", min_runtime_s=3 * 3600)))
    s.handle(JobArrived(10, "a2", job(4, allocation="team-a", min_runtime_s=3 * 3600)))
    s.handle(JobArrived(10, "free", job(4, allocation="team-a")))
    return s


def test_the_scheduler_explains_a_pending_job_from_its_state() -> None:
    s = busy_cluster()
    why = s.explain("a2")
    assert why is not None
    assert why.text == (
        "needs 4×GPU on one node; the largest free block is 0; "
        "team-a ranks 1 of 2 by fair share (usage/entitlement 0.00); 1 job ahead of it"
    )
    free = s.explain("free")
    assert free is not None
    assert free.jobs_ahead == 2  # a1 and a2: allocated work goes before free work
    assert free.text.endswith("; 2 jobs ahead of it; free work runs only on otherwise idle GPUs")


def test_the_scheduler_explains_running_work_under_its_contract() -> None:
    why = busy_cluster().explain("big")
    assert why is not None
    # team-b did all the work (share 1.0) but is entitled to 0.25.
    assert why.text == (
        "running on n0; protected by its contract for 3590 s more; "
        "team-b ranks 2 of 2 by fair share (usage/entitlement 4.00)"
    )


def test_running_free_work_is_told_how_long_it_has_to_save() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n0", 8)))
    s.handle(JobArrived(0, "free", job(1)))  # minimum runtime 0: free work
    s.handle(TaskStarted(0, "free", "free/0", "n0"))
    why = s.explain("free")
    assert why is not None
    assert why.text.startswith(
        "running on n0; free work: other work may take its GPUs at any moment, "
        "5 s after asking it to stop (SIGTERM); "
    )


def test_work_beyond_its_share_is_explained_as_borrowed() -> None:
    s = Scheduler()
    s.handle(BudgetSet(0, tree(**{"team-a": 3, "team-b": 1})))
    s.handle(NodeJoined(0, node("n0", 8)))
    s.handle(JobArrived(0, "mine", job(2, allocation="team-b", min_runtime_s=3600)))
    s.handle(JobArrived(0, "more", job(2, allocation="team-b", min_runtime_s=3600)))
    for job_id in ("mine", "more"):
        s.handle(TaskStarted(0, job_id, f"{job_id}/0", "n0"))
    texts = {job_id: getattr(s.explain(job_id), "text", "") for job_id in ("mine", "more")}
    assert "protected by its contract" in texts["mine"]  # 2 of the 8 GPUs: its share
    assert texts["more"].startswith(
        "running on n0; on GPUs borrowed beyond team-b's share: its minimum runtime does "
        "not protect it there, and a team below its share may take them back; "
    )


def test_running_work_with_an_estimate_says_when_it_should_end() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n0", 8)))
    s.handle(JobArrived(0, "once", job(1)))
    s.handle(TaskStarted(0, "once", "once/0", "n0"))
    s.handle(TaskEnded(300, "once", "once/0", "n0"))  # alice's jobs run 300 s
    for job_id, estimate in (("asked", 7200.0), ("learned", 0.0)):
        s.handle(JobArrived(400, job_id, job(1, runtime_estimate_s=estimate)))
        s.handle(TaskStarted(400, job_id, f"{job_id}/0", "n0"))
    s.handle(Tick(500))
    texts = {job_id: getattr(s.explain(job_id), "text", "") for job_id in ("asked", "learned")}
    assert "; estimated to end in 7100 s; " in texts["asked"]  # its requested limit
    assert "; estimated to end in 200 s; " in texts["learned"]
    s.handle(Tick(800))  # overdue: nothing said
    assert "estimated" not in getattr(s.explain("learned"), "text", "")


def test_once_the_contract_is_met_the_explanations_follow_the_preemption() -> None:
    s = busy_cluster()
    s.handle(Tick(3700))  # big is past its contract: a1 preempts it
    big, a1 = s.explain("big"), s.explain("a1")
    assert big is not None and a1 is not None
    assert big.text.startswith("running on n0; being stopped (preempted); ")
    assert a1.text == (
        "needs 4×GPU on one node; the largest free block is 0; "
        "n0 is reserved for it while preempted work stops; "
        "team-a ranks 1 of 2 by fair share (usage/entitlement 0.00); 0 jobs ahead of it"
    )


def test_the_scheduler_has_nothing_to_say_about_an_unknown_job() -> None:
    assert busy_cluster().explain("nope") is None
