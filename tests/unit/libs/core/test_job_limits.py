"""What a lab's job relies on: parts on named nodes with a rendezvous, a gang that lives
and dies as one, a time limit, and jobs that wait for others: scenario by scenario."""

from __future__ import annotations

from dataclasses import replace

from libs.core import (
    BudgetSet,
    Cancel,
    CancelRequested,
    Dependency,
    GangPart,
    JobArrived,
    JobId,
    NodeJoined,
    Place,
    Refused,
    Reject,
    Scheduler,
    Stop,
    StopCause,
    TaskCheckpointed,
    TaskEnded,
    TaskStarted,
    Tick,
    Wait,
)
from libs.core.decisions import Decision
from tests.builders import job, node, tree
from tests.unit.libs.core.test_budget_policy import placed


def addressed(*sizes: int) -> Scheduler:
    """Nodes n0, n1, ... of ``sizes`` GPUs, each reachable at 10.0.0.<i>."""
    s = Scheduler()
    s.handle(BudgetSet(0, tree(**{"team-a": 1})))
    for i, gpus in enumerate(sizes):
        s.handle(NodeJoined(0, replace(node(f"n{i}", gpus), address=f"10.0.0.{i}")))
    return s


def start_all(s: Scheduler, at: float, decisions: list[Decision]) -> list[Place]:
    places = [d for d in decisions if isinstance(d, Place)]
    for p in places:
        s.handle(TaskStarted(at, p.job_id, p.task_id, p.node_id))
    return places


def test_a_job_on_named_nodes_gets_equal_parts_on_distinct_nodes_and_one_rendezvous() -> None:
    s = addressed(8, 8, 8)
    s.handle(JobArrived(1, "busy", job(5)))  # n0 is the fullest that holds 2 after this
    places = start_all(s, 2, s.handle(JobArrived(2, "train", job(4, nodes=2))))
    assert [(p.task_id, p.node_id, len(p.gpu_indices)) for p in places] == [
        ("train/0.0", "n0", 2),
        ("train/0.1", "n1", 2),
    ]
    gang = (GangPart("n0", "10.0.0.0", 2), GangPart("n1", "10.0.0.1", 2))
    assert {(p.gang, p.master_port) for p in places} == {(gang, 29500)}
    # Another gang whose rank 0 is on n0 gets the next port there; one-node jobs none.
    again = [d for d in s.handle(JobArrived(3, "again", job(2, nodes=2))) if isinstance(d, Place)]
    assert again[0].node_id == "n0" and {p.master_port for p in again} == {29501}
    single = [d for d in s.handle(JobArrived(4, "one", job(1))) if isinstance(d, Place)]
    assert (single[0].gang, single[0].master_port) == ((), 0)


def test_a_job_on_named_nodes_waits_for_room_on_enough_nodes() -> None:
    s = addressed(4, 4)
    start_all(s, 1, s.handle(JobArrived(1, "wide", job(3))))
    d = s.handle(JobArrived(2, "train", job(4, nodes=2)))
    assert placed(d) == []
    assert [w.reason for w in d if isinstance(w, Wait)] == [
        "needs 4×GPU as 2 parts of 2 on distinct nodes; waiting for room on 2 nodes"
    ]
    assert placed(s.handle(TaskEnded(5, "wide", "wide/0", "n0"))) == ["train", "train"]
    never = s.handle(JobArrived(6, "never", job(9, nodes=3)))
    assert [w.reason for w in never if isinstance(w, Wait)] == [
        "needs 9×GPU as 3 parts of 3 on distinct nodes; only 2 such nodes have 3 GPUs"
    ]


def test_a_part_that_exits_non_zero_stops_the_rest_of_its_gang() -> None:
    s = addressed(8, 8)
    start_all(s, 1, s.handle(JobArrived(1, "train", job(4, nodes=2))))
    d = s.handle(TaskEnded(10, "train", "train/0.1", "n1", exit_code=3))
    assert [(x.task_id, x.cause, x.reason) for x in d if isinstance(x, Stop)] == [
        (
            "train/0.0",
            StopCause.GANG_FAILED,
            "rank 1 exited with code 3: its gang lives and dies as one",
        )
    ]
    # Its last part's end (killed by the stop) ends it for good: nothing is requeued.
    assert s.handle(TaskEnded(11, "train", "train/0.0", "n0", exit_code=-15)) == []


def test_a_job_is_stopped_at_its_time_limit_counted_from_its_start() -> None:
    s = addressed(8)
    start_all(s, 10, s.handle(JobArrived(1, "limited", job(1, time_limit_s=5))))
    assert s.handle(Tick(14.9)) == []
    d = s.handle(Tick(15))
    assert [(x.task_id, x.cause, x.reason) for x in d if isinstance(x, Stop)] == [
        ("limited/0", StopCause.TIME_LIMIT, "reached its time limit of 5 s")
    ]
    assert s.handle(Tick(16)) == []  # asked once
    assert s.estimate_s(job(1, time_limit_s=5)) == 5.0  # its limit is its estimate


def test_a_job_waits_for_its_dependency_and_starts_when_it_finishes() -> None:
    s = addressed(8)
    start_all(s, 1, s.handle(JobArrived(1, "prep", job(1))))
    d = s.handle(JobArrived(2, "train", job(1, after=(Dependency("prep"),))))
    assert placed(d) == []
    reason = "waits for prep to finish with exit code 0 (after prep:ok)"
    assert [w.reason for w in d if isinstance(w, Wait)] == [reason]
    why = s.explain("train")
    assert why is not None and reason in why.text
    assert placed(s.handle(TaskEnded(5, "prep", "prep/0", "n0"))) == ["train"]
    # A dependency that already finished is met at once.
    assert placed(s.handle(JobArrived(6, "eval", job(1, after=(Dependency("prep"),))))) == ["eval"]


def test_a_failed_dependency_cancels_its_dependents_in_turn_and_any_waits_only_for_the_end() -> (
    None
):
    s = addressed(8)
    start_all(s, 1, s.handle(JobArrived(1, "prep", job(1))))
    s.handle(JobArrived(2, "train", job(1, after=(Dependency("prep"),))))
    s.handle(JobArrived(3, "report", job(1, after=(Dependency("train"),))))
    s.handle(JobArrived(4, "cleanup", job(1, after=(Dependency("train", any_end=True),))))
    d = s.handle(TaskEnded(5, "prep", "prep/0", "n0", exit_code=2))
    assert [(c.job_id, c.reason) for c in d if isinstance(c, Cancel)] == [
        ("train", "cancelled: dependency prep failed (exited with code 2) (after prep:ok)"),
        ("report", "cancelled: dependency train was cancelled (after train:ok)"),
    ]
    assert placed(d) == ["cleanup"]


def test_a_dependency_must_be_a_job_submitted_before() -> None:
    s = addressed(8)
    d = s.handle(JobArrived(1, "orphan", job(1, after=(Dependency("nobody"),))))
    assert [(r.field, r.reason) for r in d if isinstance(r, Reject)] == [
        ("after", "no job nobody to wait for (only for jobs submitted before it)")
    ]


def test_a_job_that_waits_for_its_dependencies_can_be_cancelled() -> None:
    s = addressed(8)
    start_all(s, 1, s.handle(JobArrived(1, "prep", job(1))))
    s.handle(JobArrived(2, "train", job(1, after=(Dependency("prep"),))))
    d = s.handle(CancelRequested(3, "train"))
    assert [c.reason for c in d if isinstance(c, Cancel)] == [
        "cancelled while it waited for its dependencies"
    ]
    assert placed(s.handle(TaskEnded(5, "prep", "prep/0", "n0"))) == []


def test_a_warning_comes_before_a_time_limit_and_a_preemption_but_not_a_cancellation() -> None:
    s = addressed(8)
    warned = job(1, time_limit_s=60, warning_signal="USR1", warning_s=20)
    start_all(s, 0, s.handle(JobArrived(0, "limited", warned)))
    assert s.handle(Tick(39.9)) == []
    stops = [x for x in s.handle(Tick(40)) if isinstance(x, Stop)]  # SIGTERM at the limit
    assert [(x.cause, x.warn_signal, x.warn_s) for x in stops] == [
        (StopCause.TIME_LIMIT, "USR1", 20.0)
    ]
    free = job(8, allocation="team-a", resumable=True, warning_signal="USR2", warning_s=3600)
    start_all(s, 41, s.handle(TaskEnded(41, "limited", "limited/0", "n0")))
    start_all(s, 42, s.handle(JobArrived(42, "free", free)))
    preempted = [
        x
        for x in s.handle(
            JobArrived(50, "paid", job(8, min_runtime_s=600, warning_signal="USR1", warning_s=9))
        )
        if isinstance(x, Stop)
    ]
    # Capped by the policy's max_stop_warning_s (300 s by default).
    assert [(x.cause, x.warn_signal, x.warn_s) for x in preempted] == [
        (StopCause.PREEMPTED, "USR2", 300.0)
    ]
    cancelled = [x for x in s.handle(CancelRequested(51, "free")) if isinstance(x, Stop)]
    assert cancelled == []  # already stopping
    start_all(s, 60, s.handle(TaskEnded(60, "free", "free/0", "n0")))
    stop = [x for x in s.handle(CancelRequested(61, "paid")) if isinstance(x, Stop)]
    assert [(x.cause, x.warn_signal, x.warn_s) for x in stop] == [(StopCause.CANCELLED, "", 0.0)]


def test_a_job_on_named_nodes_preempts_free_work_for_a_part_on_each() -> None:
    s = addressed(4, 4, 4)
    for i in range(3):  # free work on every node: 3 GPUs of each busy
        start_all(s, 1, s.handle(JobArrived(1, f"free-{i}", job(3, resumable=True))))
    d = s.handle(JobArrived(20, "train", job(4, nodes=2, min_runtime_s=600)))
    assert placed(d) == []
    assert sorted(x.job_id for x in d if isinstance(x, Stop)) == ["free-0", "free-1"]
    for x in d:
        if isinstance(x, Stop):
            d = s.handle(TaskEnded(25, x.job_id, x.task_id, x.node_id, exit_code=-15))
    assert sorted(p.node_id for p in d if isinstance(p, Place) and p.job_id == "train") == [
        "n0",
        "n1",
    ]


def test_an_agent_that_took_its_tasks_back_registers_its_incarnation_again_and_they_run_on() -> (
    None
):
    s = Scheduler()
    s.handle(BudgetSet(0, tree(**{"team-a": 1})))
    s.handle(NodeJoined(0, node("n0", 8), "one", heartbeat_s=1))
    start_all(s, 1, s.handle(JobArrived(1, "long", job(4))))
    # Restarted within the lease: the same incarnation, its task kept.
    assert s.handle(NodeJoined(3, node("n0", 8), "one", heartbeat_s=1)) == []
    assert s.handle(TaskEnded(4, "long", "long/0", "n0")) == []  # it ran to its end
    start_all(s, 5, s.handle(JobArrived(5, "next", job(4))))
    for second in range(6, 61):  # the ticker ticks; the node is silent: lost, "next" too
        s.handle(Tick(second))
    refused = s.handle(NodeJoined(61, node("n0", 8), "one", heartbeat_s=1))
    assert [(r.subject, r.reason) for r in refused if isinstance(r, Refused)] == [
        ("n0", "incarnation one was declared lost: register a new one")
    ]
    assert placed(s.handle(NodeJoined(62, node("n0", 8), "two", heartbeat_s=1))) == []
    assert placed(s.handle(JobArrived(63, "after", job(4)))) == ["after"]


def test_work_that_says_when_it_saved_loses_what_it_did_since_and_is_spared() -> None:
    s = addressed(4, 4)
    for name in ("saves", "quiet"):  # one on each node: saves on n0, quiet on n1
        start_all(s, 1, s.handle(JobArrived(1, name, job(4, resumable=True))))
    # "saves" says it saved at 10: stopping it at 100 throws 90 s of its 4 GPUs away;
    # "quiet" saves when told to stop, and loses nothing.
    s.handle(TaskCheckpointed(10, "saves", "saves/0", "n0"))
    d = s.handle(JobArrived(100, "paid", job(4, min_runtime_s=600)))
    assert [x.job_id for x in d if isinstance(x, Stop)] == ["quiet"]
    assert s._facts.running.jobs[JobId("saves")].checkpointed_at == 10
