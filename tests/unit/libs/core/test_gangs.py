"""Gangs get their turn (earmarks), running gangs are preempted whole, and preemption
throws away as little work as it can: the scheduler, scenario by scenario."""

from __future__ import annotations

from libs.core import JobArrived, Place, Scheduler, Stop, TaskEnded, TaskStarted, Tick, Wait
from tests.builders import job
from tests.unit.libs.core.test_budget_policy import (
    HOUR,
    charged,
    cluster,
    placed,
    run_job,
    stopped,
)


def gang_behind_small_jobs() -> Scheduler:
    """Two 4-GPU nodes, each with a 3-GPU job of the gang's own allocation (which it may
    not preempt), likely to end at 3 h and 4 h; an 8-GPU gang of that allocation waits."""
    s = cluster(4, 4, a=1, b=1)
    charged(s, a=0.0, b=1e9)
    run_job(
        s, HOUR, "small-1", job(3, allocation="a", min_runtime_s=60, runtime_estimate_s=2 * HOUR)
    )
    run_job(
        s, HOUR, "small-2", job(3, allocation="a", min_runtime_s=60, runtime_estimate_s=3 * HOUR)
    )
    d = s.handle(JobArrived(HOUR + 20, "gang", job(8, allocation="a", min_runtime_s=60)))
    assert placed(d) == []
    assert [w.reason for w in d if isinstance(w, Wait)] == [
        "needs 8×GPU; n0, n1 are earmarked for it as they free up"
    ]
    return s


def test_a_gang_holds_the_nodes_that_free_soonest_and_starts_when_they_do() -> None:
    s = gang_behind_small_jobs()
    # Charged work behind it that might outlast its start (nobody knows how long bob's
    # work runs) no longer slips past.
    more = job(1, allocation="a", user="bob", min_runtime_s=int(3 * HOUR))
    assert placed(s.handle(JobArrived(HOUR + 30, "more", more))) == []
    assert placed(s.handle(TaskEnded(2 * HOUR, "small-1", "small-1/0", "n0"))) == []
    assert placed(s.handle(TaskEnded(2.5 * HOUR, "small-2", "small-2/0", "n1"))) == ["gang", "gang"]


def test_why_shows_the_hold_and_an_estimated_start() -> None:
    s = gang_behind_small_jobs()
    why = s.explain("gang")
    assert why is not None
    said = "n0, n1 are earmarked for it: only work that cannot delay it runs there meanwhile"
    assert said in why.text
    # small-2 likely ends at 4 h: the later of the two nodes.
    assert f"estimated start in {4 * HOUR - (HOUR + 20):.0f} s" in why.text


def test_held_nodes_take_only_work_that_cannot_delay_the_gang() -> None:
    s = gang_behind_small_jobs()
    # Free work can always be preempted; b ranks below a, so b's work whose contract
    # ends by 4 h may be preempted then; a's own work only if it likely ends by then.
    b_long = job(1, allocation="b", min_runtime_s=int(4 * HOUR))
    assert placed(s.handle(JobArrived(HOUR + 30, "b-long", b_long))) == []
    b_short = job(1, allocation="b", min_runtime_s=int(HOUR), resumable=True)
    assert placed(s.handle(JobArrived(HOUR + 31, "b-short", b_short))) == ["b-short"]
    a_short = job(1, allocation="a", min_runtime_s=int(HOUR), runtime_estimate_s=HOUR)
    assert placed(s.handle(JobArrived(HOUR + 32, "a-short", a_short))) == ["a-short"]


def test_work_on_held_nodes_is_stopped_in_one_step_when_the_gang_can_go() -> None:
    s = gang_behind_small_jobs()
    free = job(1, allocation="b", resumable=True)
    assert placed(s.handle(JobArrived(HOUR + 30, "free", free))) == ["free"]
    assert placed(s.handle(JobArrived(HOUR + 40, "free-2", free))) == ["free-2"]
    s.handle(TaskEnded(3 * HOUR, "small-1", "small-1/0", "n0"))
    d = s.handle(TaskEnded(4 * HOUR, "small-2", "small-2/0", "n1"))
    assert stopped(d) == ["free", "free-2"]
    places = {p.job_id: p.node_id for p in d if isinstance(p, Place)}
    assert places == {}
    for x in d:
        if isinstance(x, Stop):
            last = s.handle(TaskEnded(4 * HOUR + 30, x.job_id, x.task_id, x.node_id))
    assert placed(last) == ["gang", "gang"]


def test_a_running_gang_is_preempted_whole_for_a_higher_ranked_gang() -> None:
    s = cluster(8, 8, a=1, b=1)
    charged(s, a=1e9, b=0.0)  # a ranks below b
    over = job(16, allocation="a", min_runtime_s=60, resumable=True)
    run_job(s, 0, "a-gang", over)
    d = s.handle(JobArrived(HOUR, "b-gang", job(16, allocation="b", min_runtime_s=60)))
    assert stopped(d) == ["a-gang"]
    assert len([x for x in d if isinstance(x, Stop)]) == 2  # both its tasks, in one step


def test_debug_work_throws_away_little_work() -> None:
    # 10 hours of 4 GPUs is more than the contract cap's worth (8 h) of a 1-GPU job.
    s = cluster(4, a=1, b=1)
    charged(s, a=1e9, b=0.0)
    run_job(s, 0, "cannot-resume", job(4, allocation="a", min_runtime_s=60))
    debug = job(1, allocation="b", min_runtime_s=600)
    d = s.handle(JobArrived(10 * HOUR, "debug", debug))
    assert stopped(d) == [] and placed(d) == []
    s2 = cluster(4, a=1, b=1)
    charged(s2, a=1e9, b=0.0)
    run_job(s2, 0, "resumes", job(4, allocation="a", min_runtime_s=60, resumable=True))
    assert stopped(s2.handle(JobArrived(10 * HOUR, "debug", debug))) == ["resumes"]
    # At most what the debug job itself will do: its minimum runtime on its GPUs (the
    # victim, on borrowed GPUs beyond a's share, is not protected).
    for ran_s, stops in ((600, ["short"]), (601, [])):
        s3 = cluster(1, a=1, b=1)
        charged(s3, a=1e9, b=0.0)
        run_job(s3, 0, "short", job(1, allocation="a", min_runtime_s=int(HOUR)))
        assert stopped(s3.handle(JobArrived(ran_s, "debug", debug))) == stops


def test_charged_work_throws_work_away_only_when_no_room_comes_soon_and_not_much() -> None:
    def blocked_after(hours: float, *, min_runtime_h: float) -> list[str]:
        s = cluster(4, a=1, b=1)
        charged(s, a=1e9, b=0.0)
        run_job(s, 0, "cannot-resume", job(4, allocation="a", min_runtime_s=60))
        b_job = job(4, allocation="b", min_runtime_s=int(min_runtime_h * HOUR))
        return stopped(s.handle(JobArrived(hours * HOUR, "b-job", b_job)))

    # Nobody knows when it ends, so b's job does not wait for it: 6 hours of 4 GPUs are
    # thrown away, within what b's job is sure to do (its 8-hour minimum runtime on 4 GPUs) ...
    assert blocked_after(6, min_runtime_h=8) == ["cannot-resume"]
    # ... but not 10 hours of them, nor 6 for a job sure to do only 2: b's job waits.
    assert blocked_after(10, min_runtime_h=8) == []
    assert blocked_after(6, min_runtime_h=2) == []


def test_a_job_may_throw_away_work_that_started_while_it_waited() -> None:
    s = cluster(4, a=1, b=1)
    charged(s, a=1e9, b=0.0)
    # u cannot resume and nobody knows when it ends: b's job gets no earmark, and u's hour
    # of 2 GPUs is more than b's job is sure to do (10 minutes of 4 GPUs).
    run_job(s, 0, "u", job(2, allocation="a", min_runtime_s=60))
    b_job = job(4, allocation="b", min_runtime_s=600)
    assert stopped(s.handle(JobArrived(HOUR, "b-job", b_job))) == []
    run_job(s, HOUR + 1, "x", job(2, allocation="a", min_runtime_s=60))  # the 2 GPUs left
    # u ends at 3 h; x, which started after b's job began to wait, has done less than
    # that wait (2 hours of 4 GPUs): b's job throws it away rather than wait for good.
    assert stopped(s.handle(TaskEnded(3 * HOUR, "u", "u/0", "n0"))) == ["x"]


def test_a_start_report_decides_nothing_until_a_round_which_counts_the_contract_from_it() -> None:
    """A start changes only what preemption reads (the contract's clock): at the same
    clock, a pass could decide otherwise only in a preemption round (a gang reports
    once per task)."""
    s = cluster(1, a=1, b=1)
    charged(s, a=1e6, b=0.0)
    a_job = job(1, allocation="a", min_runtime_s=int(HOUR), resumable=True)
    [place] = s.handle(JobArrived(1, "a-job", a_job))
    assert isinstance(place, Place)
    # b ranks first, but a's work has not started: its contract protects it until then.
    b_job = job(1, allocation="b", min_runtime_s=int(HOUR))
    assert placed(s.handle(JobArrived(1, "b-job", b_job))) == []
    assert s.handle(TaskStarted(1, "a-job", place.task_id, "n0")) == []
    assert stopped(s.handle(Tick(HOUR + 1))) == ["a-job"]  # its contract ran from the report


def test_a_hold_frees_its_node_in_the_first_round_after_the_contract_there_ends() -> None:
    # Rounds between an earmark's refreshes skip a search that failed while nothing it read
    # changed; a contract ending on an earmarked node is such a change.
    s = cluster(4, 4, a=1, b=1)
    charged(s, a=0.0, b=1e9)  # b ranks below a
    b_job = job(4, allocation="b", min_runtime_s=int(2 * HOUR), resumable=True)
    run_job(s, 0, "b-job", b_job)  # on n0, protected until 2 h
    run_job(s, 0, "a-job", job(4, allocation="a", min_runtime_s=60))  # on n1: a's own
    at = 1.6 * HOUR  # the earmark is chosen afresh at 1.85 h and 2.1 h: neither is 2 h
    d = s.handle(JobArrived(at, "waiter", job(4, allocation="a", min_runtime_s=60)))
    assert [w.reason for w in d if isinstance(w, Wait)] == [
        "needs 4×GPU; n0 are earmarked for it as they free up"
    ]
    while at < 2 * HOUR:
        at += 60
        assert stopped(s.handle(Tick(at))) == ([] if at < 2 * HOUR else ["b-job"])
