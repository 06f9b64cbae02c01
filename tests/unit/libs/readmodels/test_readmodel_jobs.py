"""The job fold: each event's effect, requeues, order tolerance, and listing."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import reduce
from typing import TypedDict

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.events import event_type
from libs.readmodels import (
    JobFilter,
    Scope,
    apply_job_event,
    has_ended,
    job_key,
    newest_jobs,
    task_is_over,
)
from tests.unit.libs.readmodels.folds import folded_job
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    cancelled,
    failed,
    finished,
    idle,
    pending,
    placed,
    preempted,
    registered,
    rejected,
    requeued,
    spec,
    started,
    stop,
    submitted,
    tick,
)

S = types_pb2.JobState
NON_TERMINAL_ORDER = [
    S.JOB_STATE_UNSPECIFIED,
    S.JOB_STATE_SUBMITTED,
    S.JOB_STATE_PENDING,
    S.JOB_STATE_PLACED,
    S.JOB_STATE_RUNNING,
]
TERMINAL = {
    S.JOB_STATE_REJECTED,
    S.JOB_STATE_FINISHED,
    S.JOB_STATE_FAILED,
    S.JOB_STATE_PREEMPTED,
    S.JOB_STATE_CANCELLED,
    S.JOB_STATE_TIMEOUT,
}

CANCELLED = types_pb2.STOP_CAUSE_CANCELLED
TIME_LIMIT = types_pb2.STOP_CAUSE_TIME_LIMIT
GANG_FAILED = types_pb2.STOP_CAUSE_GANG_FAILED
TIMED_OUT = "reached its time limit of 5 s"
PLACED = ("n1", [0])  # where placed("j") puts it


# --- one event at a time ------------------------------------------------------


def test_submission_creates_the_job() -> None:
    job = folded_job([submitted("j1", at=T0 + 5)])
    assert job.job_id == "j1"
    assert job.state == S.JOB_STATE_SUBMITTED
    assert job.spec == spec()
    assert job.submitted_at.seconds == int(T0) + 5


@dataclass
class Case:
    name: str
    events: list[events_pb2.Envelope]
    state: types_pb2.JobState.ValueType
    reason: str = ""
    on: tuple[str, list[int]] = ("", [])  # node id, GPU indices
    exit_code: int = 0
    stop_reason: str = ""


CASES = [
    Case(
        "rejected names the field",
        [submitted("j"), rejected("j", "gpus", "gpus: must be 1..64")],
        S.JOB_STATE_REJECTED,
        reason="gpus: must be 1..64",
    ),
    Case(
        "rejected without a field",
        [submitted("j"), rejected("j", "", "not a member")],
        S.JOB_STATE_REJECTED,
        reason="not a member",
    ),
    Case("admitted waits", [submitted("j"), admitted("j")], S.JOB_STATE_PENDING),
    Case(
        "pending keeps the latest reason",
        [submitted("j"), admitted("j"), pending("j", "no node fits"), pending("j", "queued")],
        S.JOB_STATE_PENDING,
        reason="queued",
    ),
    Case(
        "placement clears the waiting reason",
        [submitted("j"), admitted("j"), pending("j", "queued"), placed("j", "n2", [1, 3])],
        S.JOB_STATE_PLACED,
        on=("n2", [1, 3]),
    ),
    Case(
        "started",
        [submitted("j"), admitted("j"), placed("j"), started("j")],
        S.JOB_STATE_RUNNING,
        on=PLACED,
    ),
    Case(
        "finished",
        [submitted("j"), admitted("j"), placed("j"), started("j"), finished("j", exit_code=0)],
        S.JOB_STATE_FINISHED,
        on=PLACED,
    ),
    Case(
        "failed",
        [
            submitted("j"),
            admitted("j"),
            placed("j"),
            started("j"),
            failed("j", "oom", exit_code=137),
        ],
        S.JOB_STATE_FAILED,
        reason="oom",
        on=PLACED,
        exit_code=137,
    ),
    Case(
        "stop requested, still running",
        [submitted("j"), admitted("j"), placed("j"), started("j"), stop("j", "preempted")],
        S.JOB_STATE_RUNNING,
        on=PLACED,
        stop_reason="preempted",
    ),
    Case(
        "preempted for good",
        [placed("j"), started("j"), stop("j", "for team-b"), preempted("j", "for team-b")],
        S.JOB_STATE_PREEMPTED,
        reason="for team-b",
        on=PLACED,
        stop_reason="for team-b",
    ),
    Case(
        "a preempted job's task end does not undo the preemption",
        [placed("j"), preempted("j", "for team-b"), failed("j", "SIGTERM", exit_code=143)],
        S.JOB_STATE_PREEMPTED,
        reason="for team-b",
        on=PLACED,
        exit_code=143,
    ),
    Case(
        "stopped for preemption, failed, placement not decided yet",
        [placed("j"), started("j"), stop("j", "preempted"), failed("j", "SIGTERM", exit_code=143)],
        S.JOB_STATE_FAILED,
        reason="SIGTERM",
        on=PLACED,
        exit_code=143,
        stop_reason="preempted",
    ),
    Case(
        "a task end after a stop for cancellation is a cancellation",
        [
            placed("j"),
            started("j"),
            stop("j", "cancelled by user", cause=CANCELLED),
            finished("j", exit_code=143),
        ],
        S.JOB_STATE_CANCELLED,
        on=PLACED,
        exit_code=143,
        stop_reason="cancelled by user",
    ),
    Case(
        "a stop for cancellation seen after the task end still cancels",
        [
            placed("j"),
            started("j"),
            failed("j", "SIGTERM", exit_code=143),
            stop("j", "cancelled", cause=CANCELLED),
        ],
        S.JOB_STATE_CANCELLED,
        reason="SIGTERM",
        on=PLACED,
        exit_code=143,
        stop_reason="cancelled",
    ),
    Case(
        "a task end after a stop for its time limit is a timeout, told by the stop",
        [
            placed("j"),
            started("j"),
            stop("j", TIMED_OUT, cause=TIME_LIMIT),
            failed("j", f"stop requested: {TIMED_OUT}", exit_code=143),
        ],
        S.JOB_STATE_TIMEOUT,
        reason=TIMED_OUT,
        on=PLACED,
        exit_code=143,
        stop_reason=TIMED_OUT,
    ),
    Case(
        "a stop for its time limit seen after the task end still times out",
        [placed("j"), started("j"), finished("j"), stop("j", TIMED_OUT, cause=TIME_LIMIT)],
        S.JOB_STATE_TIMEOUT,
        reason=TIMED_OUT,
        on=PLACED,
        stop_reason=TIMED_OUT,
    ),
    Case(
        "cancelled before it started",
        [submitted("j"), admitted("j"), pending("j", "queued"), cancelled("j", "withdrawn")],
        S.JOB_STATE_CANCELLED,
        reason="withdrawn",
    ),
    Case(
        "late placement fills in fields but never moves the job back",
        [submitted("j"), started("j", node=""), finished("j"), placed("j", "n7", [2])],
        S.JOB_STATE_FINISHED,
        on=("n7", [2]),
    ),
    Case(
        "late pending after running is ignored",
        [submitted("j"), placed("j"), started("j"), pending("j", "queued"), admitted("j")],
        S.JOB_STATE_RUNNING,
        on=PLACED,
    ),
    Case(
        "terminal states stick",
        [submitted("j"), rejected("j", "gpus", "gpus: too many"), admitted("j"), pending("j", "x")],
        S.JOB_STATE_REJECTED,
        reason="gpus: too many",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fold(case: Case) -> None:
    job = folded_job(case.events)
    assert job.job_id == "j"
    assert job.state == case.state
    assert job.reason == case.reason
    assert (job.node_id, list(job.gpu_indices)) == case.on
    assert job.exit_code == case.exit_code
    assert job.stop_reason == case.stop_reason
    assert job.HasField("finished_at") == (case.state in TERMINAL)


def test_timestamps_come_from_the_events() -> None:
    job = folded_job([submitted("j", at=T0), started("j", at=T0 + 2), finished("j", at=T0 + 9)])
    assert (job.submitted_at.seconds, job.started_at.seconds, job.finished_at.seconds) == (
        int(T0),
        int(T0) + 2,
        int(T0) + 9,
    )


def test_any_job_event_creates_an_unknown_job() -> None:
    job = folded_job([placed("j", "n3", [0, 1])])
    assert (job.state, job.node_id, job.spec) == (S.JOB_STATE_PLACED, "n3", spec())


def test_submission_spec_wins_over_copies() -> None:
    own = spec(allocation="team-b", gpus=2)
    job = folded_job([placed("j"), submitted("j", s=own)])
    assert job.spec == own


@pytest.mark.parametrize("envelope", [registered("n1"), tick()])
def test_envelopes_about_no_job_change_nothing(envelope: events_pb2.Envelope) -> None:
    job = folded_job([submitted("j")])
    assert job_key(envelope) is None
    assert apply_job_event(job, envelope) is job
    assert apply_job_event(None, envelope) is None


def test_event_without_job_id_is_ignored() -> None:
    assert job_key(pending("", "x")) is None
    assert apply_job_event(None, pending("", "x")) is None


def test_inputs_are_not_mutated() -> None:
    job = folded_job([submitted("j"), admitted("j")])
    before = job.SerializeToString(deterministic=True)
    event = placed("j", "n1", [0])
    event_before = event.SerializeToString(deterministic=True)
    after = apply_job_event(job, event)
    assert after is not job
    assert job.SerializeToString(deterministic=True) == before
    assert event.SerializeToString(deterministic=True) == event_before


def test_wrong_job_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="j2"):
        apply_job_event(folded_job([submitted("j1")]), submitted("j2"))


# --- requeues, idleness and task ids -------------------------------------------

T1, T2 = "j/1", "j/2"


def preempted_once() -> list[events_pb2.Envelope]:
    return [
        submitted("j"),
        admitted("j"),
        placed("j", "n1", [0]),
        started("j", "n1"),
        stop("j", "for team-b", "n1"),
        failed("j", "SIGTERM", exit_code=143),
    ]


def test_a_waiting_job_keeps_its_reasons_code_until_it_leaves_the_queue() -> None:
    words = "needs 8×GPU on one node; waiting for a block that large to free up"
    waiting = [submitted("j"), admitted("j"), pending("j", words, code="no_block")]
    job = folded_job(waiting)
    assert (job.state, job.reason, job.wait_code) == (S.JOB_STATE_PENDING, words, "no_block")
    job = folded_job([*waiting, placed("j", "n1", [0])])
    assert (job.state, job.reason, job.wait_code) == (S.JOB_STATE_PLACED, "", "")


def test_requeue_after_preemption_waits_again_and_keeps_attempts() -> None:
    job = folded_job([*preempted_once(), requeued("j", "preempted by team-b; waits")])
    assert job.state == S.JOB_STATE_PENDING
    assert job.reason == "preempted by team-b; waits"
    assert job.attempts == 1
    # Nothing of the stopped task is left to mislead: it holds no node now.
    assert (job.node_id, list(job.gpu_indices), job.exit_code, job.stop_reason) == ("", [], 0, "")
    assert not job.HasField("started_at") and not job.HasField("finished_at")
    assert not has_ended(job)


def test_a_requeued_job_runs_its_next_task_to_the_end() -> None:
    job = folded_job(
        [
            *preempted_once(),
            requeued("j"),
            pending("j", "queued behind team-b"),
            placed("j", "n2", [3], task=T1),
            started("j", "n2", at=T0 + 5, task=T1),
            finished("j", node="n2", exit_code=0, at=T0 + 9, task=T1),
        ]
    )
    assert (job.state, job.attempts, job.node_id, list(job.gpu_indices)) == (
        S.JOB_STATE_FINISHED,
        2,
        "n2",
        [3],
    )
    assert (job.reason, job.stop_reason, job.exit_code) == ("", "", 0)
    assert (job.started_at.seconds, job.finished_at.seconds) == (int(T0) + 5, int(T0) + 9)
    assert has_ended(job)


def test_events_about_an_older_task_change_nothing() -> None:
    running = folded_job([*preempted_once()[:5], requeued("j"), placed("j", "n2", [3], task=T1)])
    for late in (failed("j", "SIGTERM", exit_code=143), started("j"), idle("j"), stop("j", "x")):
        assert apply_job_event(running, late) == running
    waiting = folded_job([*preempted_once()[:5], requeued("j")])
    assert apply_job_event(waiting, failed("j", "SIGTERM", exit_code=143)) == waiting


def test_a_newer_task_seen_first_makes_the_requeue_stale() -> None:
    # The events topic ran ahead: the next task started before the requeue was read.
    job = folded_job([*preempted_once(), started("j", "n2", task=T1), requeued("j")])
    assert (job.state, job.attempts, job.node_id) == (S.JOB_STATE_RUNNING, 2, "n2")
    assert job.exit_code == 0 and not job.HasField("finished_at")


def test_a_requeue_without_a_stop_for_preemption_is_ignored() -> None:
    running = folded_job([placed("j"), started("j")])
    assert apply_job_event(running, requeued("j")) == running
    cancelling = folded_job([placed("j"), started("j"), stop("j", "user", cause=CANCELLED)])
    assert apply_job_event(cancelling, requeued("j")) == cancelling


def test_a_task_ended_by_preemption_awaits_the_decision() -> None:
    stopped = folded_job(preempted_once())
    assert stopped.state == S.JOB_STATE_FAILED
    assert not has_ended(stopped)
    assert has_ended(folded_job([*preempted_once(), preempted("j")]))
    assert has_ended(folded_job([placed("j"), started("j"), failed("j", "oom")]))


def test_nothing_is_placed_after_the_end() -> None:
    job = folded_job([*preempted_once(), preempted("j")])
    assert apply_job_event(job, placed("j", "n2", task=T1)) == job


def timed_out() -> list[events_pb2.Envelope]:
    return [
        placed("j"),
        started("j"),
        stop("j", TIMED_OUT, cause=TIME_LIMIT),
        failed("j", "SIGTERM", exit_code=-15),
    ]


def test_a_timeout_is_the_end() -> None:
    job = folded_job(timed_out())
    assert has_ended(job) and task_is_over(job, "j/0")
    for late in (placed("j", "n2", task=T1), requeued("j"), started("j"), idle("j")):
        assert apply_job_event(job, late) == job
    assert not has_ended(folded_job(timed_out()[:3]))  # asked to stop, not stopped yet


@pytest.mark.parametrize("order", list(itertools.permutations(range(5))))
def test_a_job_cancelled_while_timing_out_times_out_in_any_order(order: tuple[int, ...]) -> None:
    # Placement does not stop a job it is stopping already: here its time limit came first.
    events = [*timed_out(), stop("j", "cancelled by user", cause=CANCELLED)]
    job = folded_job([events[i] for i in order])
    assert (job.state, job.reason, job.exit_code) == (S.JOB_STATE_TIMEOUT, TIMED_OUT, -15)
    assert (job.stop_cause, job.stop_reason) == (TIME_LIMIT, TIMED_OUT)


def test_idle_reports_follow_the_running_task() -> None:
    running = [placed("j"), started("j")]
    assert folded_job([*running, idle("j")]).idle
    assert not folded_job([*running, idle("j"), idle("j", is_idle=False)]).idle
    assert not folded_job([*running, idle("j"), finished("j")]).idle
    assert not folded_job([*running, finished("j"), idle("j")]).idle
    assert not folded_job([*running, idle("j"), stop("j", "x"), failed("j"), requeued("j")]).idle
    # An idle report is also news that the task runs.
    assert folded_job([placed("j"), idle("j")]).state == S.JOB_STATE_RUNNING


def test_task_is_over() -> None:
    job = folded_job([*preempted_once(), requeued("j"), placed("j", "n2", task=T1)])
    assert task_is_over(job, "j/0")
    assert not task_is_over(job, T1)
    assert not task_is_over(job, T2)  # newer than the job has seen: its events are on the way
    assert task_is_over(folded_job([*preempted_once(), requeued("j")]), "j/0")
    assert task_is_over(folded_job([placed("j"), finished("j")]), "j/0")
    assert task_is_over(folded_job([placed("j"), preempted("j")]), "j/0")
    assert not task_is_over(folded_job([placed("j"), started("j")]), "j/0")


# --- order tolerance ------------------------------------------------------------

OUTCOMES = {
    "waiting": S.JOB_STATE_PENDING,
    "rejected": S.JOB_STATE_REJECTED,
    "cancelled_before_start": S.JOB_STATE_CANCELLED,
    "placed": S.JOB_STATE_PLACED,
    "running": S.JOB_STATE_RUNNING,
    "idle": S.JOB_STATE_RUNNING,
    "finished": S.JOB_STATE_FINISHED,
    "failed": S.JOB_STATE_FAILED,
    "stopped_for_preemption": S.JOB_STATE_FAILED,
    "preempted": S.JOB_STATE_PREEMPTED,
    "cancelled_while_running": S.JOB_STATE_CANCELLED,
    "timed_out": S.JOB_STATE_TIMEOUT,
    "cancelled_while_timing_out": S.JOB_STATE_TIMEOUT,
}
reasons = st.text(alphabet="abcdefgh ", min_size=1, max_size=8)
PREEMPTING = ("stopped_for_preemption", "preempted")
TIMING_OUT = ("timed_out", "cancelled_while_timing_out")


@st.composite
def lifecycles(draw: st.DrawFn) -> tuple[list[events_pb2.Envelope], types_pb2.JobState.ValueType]:
    """One job's events (one task, no requeue) in the order written, and its final state."""
    outcome = draw(st.sampled_from(sorted(OUTCOMES)))
    clock = iter(range(int(T0), int(T0) + 100))
    j = "job-1"
    events = [submitted(j, at=next(clock))]
    if outcome == "rejected":
        return [*events, rejected(j, "gpus", "too many", at=next(clock))], OUTCOMES[outcome]
    events.append(admitted(j, at=next(clock)))
    # A job still waiting shows its one reason; a job that moved on shows none,
    # so only there may several reasons arrive in any order.
    waits = draw(st.lists(reasons, max_size=1 if outcome == "waiting" else 3))
    events += [pending(j, r, at=next(clock)) for r in waits]
    if outcome == "cancelled_before_start":
        events.append(cancelled(j, at=next(clock)))
    if outcome in ("waiting", "cancelled_before_start"):
        return events, OUTCOMES[outcome]
    node = draw(st.sampled_from(["n1", "n2"]))
    gpus = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
    protected_for = draw(st.sampled_from([None, Duration(seconds=600)]))
    events.append(
        placed(
            j,
            node,
            gpus,
            at=next(clock),
            protection=types_pb2.PROTECTION_CONTRACT
            if protected_for
            else types_pb2.PROTECTION_FREE,
            protected_for=protected_for,
        )
    )
    if outcome != "placed":
        events.append(started(j, node, at=next(clock)))
    if outcome == "idle" or (outcome != "placed" and draw(st.booleans())):
        events.append(idle(j, node=node, at=next(clock)))  # one report: see the module doc
    if outcome in PREEMPTING:
        by = types_pb2.Preemption(
            job_id="j-b", allocation="team-b", rule=types_pb2.PREEMPTION_RULE_CONTRACT_ENDED
        )
        events.append(stop(j, "preempted by team-b", node, at=next(clock), preemption=by))
    if outcome in TIMING_OUT:
        events.append(stop(j, TIMED_OUT, node, at=next(clock), cause=TIME_LIMIT))
    if outcome in ("cancelled_while_running", "cancelled_while_timing_out"):
        events.append(stop(j, "cancelled by user", node, at=next(clock), cause=CANCELLED))
    code = draw(st.integers(-15, 255))
    stopped = ("cancelled_while_running", *TIMING_OUT)
    if outcome == "finished" or (outcome in stopped and draw(st.booleans())):
        events.append(finished(j, node=node, exit_code=code, at=next(clock)))
    elif outcome in ("failed", *stopped, *PREEMPTING):
        events.append(failed(j, draw(reasons), node=node, exit_code=code, at=next(clock)))
    if outcome == "preempted":
        events.append(preempted(j, at=next(clock)))
    return events, OUTCOMES[outcome]


@given(lifecycles(), st.data())
def test_any_order_and_any_repeats_end_in_the_same_job(
    lifecycle: tuple[list[events_pb2.Envelope], types_pb2.JobState.ValueType], data: st.DataObject
) -> None:
    events, final_state = lifecycle
    in_order = folded_job(events)
    assert in_order.state == final_state
    assert in_order.idle == (
        final_state == S.JOB_STATE_RUNNING and any(e.HasField("task_idle") for e in events)
    )
    repeats = data.draw(st.lists(st.sampled_from(events), max_size=4), label="redelivered")
    shuffled = data.draw(st.permutations(events + repeats), label="arrival order")
    assert folded_job(shuffled) == in_order


def assert_never_backwards(events: list[events_pb2.Envelope]) -> None:
    """Folded one by one, the job's state never goes back: an end stays an end, and
    until then the state only climbs."""
    job: types_pb2.Job | None = None
    for event in events:
        before = job.state if job is not None else S.JOB_STATE_UNSPECIFIED
        job = apply_job_event(job, event)
        assert job is not None
        if before in TERMINAL:
            assert job.state in TERMINAL
        elif job.state not in TERMINAL:
            assert NON_TERMINAL_ORDER.index(job.state) >= NON_TERMINAL_ORDER.index(before)


@given(lifecycles(), st.data())
def test_a_job_never_moves_backwards(
    lifecycle: tuple[list[events_pb2.Envelope], types_pb2.JobState.ValueType], data: st.DataObject
) -> None:
    events, _ = lifecycle
    assert_never_backwards(data.draw(st.permutations(events)))


ENDINGS = {
    "waiting": S.JOB_STATE_PENDING,
    "running": S.JOB_STATE_RUNNING,
    "finished": S.JOB_STATE_FINISHED,
    "preempted": S.JOB_STATE_PREEMPTED,
    "cancelled": S.JOB_STATE_CANCELLED,
}


@dataclass
class Topics:
    """One job's history as the two topics carry it, and in the order it happened."""

    events: list[events_pb2.Envelope] = field(default_factory=list)
    decisions: list[events_pb2.Envelope] = field(default_factory=list)
    happened: list[events_pb2.Envelope] = field(default_factory=list)

    def event(self, env: events_pb2.Envelope) -> None:
        self.events.append(env)
        self.happened.append(env)

    def decision(self, env: events_pb2.Envelope) -> None:
        self.decisions.append(env)
        self.happened.append(env)


@st.composite
def requeue_histories(draw: st.DrawFn) -> tuple[Topics, types_pb2.JobState.ValueType, int]:
    """A job preempted and requeued one to three times, then its ending; state and attempts."""
    ending = draw(st.sampled_from(sorted(ENDINGS)))
    clock = iter(range(int(T0), int(T0) + 100))
    j = "job-1"
    log = Topics()
    log.event(submitted(j, at=next(clock)))
    log.event(admitted(j, at=next(clock)))
    requeues = draw(st.integers(1, 3))
    for n in range(requeues + (ending != "waiting" and ending != "cancelled")):
        task, node = f"{j}/{n}", draw(st.sampled_from(["n1", "n2"]))
        log.decision(placed(j, node, [n], at=next(clock), task=task))
        if n < requeues or ending != "preempted" or draw(st.booleans()):
            log.event(started(j, node, at=next(clock), task=task))
        if draw(st.booleans()):
            log.event(idle(j, node=node, at=next(clock), task=task))
        if n == requeues and ending in ("running", "finished"):
            if ending == "finished":
                log.event(finished(j, node=node, at=next(clock), task=task))
            break
        log.decision(stop(j, "preempted", node, at=next(clock), task=task))
        log.event(failed(j, "SIGTERM", node=node, exit_code=143, at=next(clock), task=task))
        if n == requeues:
            log.decision(preempted(j, at=next(clock)))
            break
        log.decision(requeued(j, f"requeued {n}", at=next(clock)))
        if draw(st.booleans()):
            log.decision(pending(j, "queued again", at=next(clock)))
    if ending == "cancelled":
        log.decision(cancelled(j, at=next(clock)))
    attempts = requeues + (ending not in ("waiting", "cancelled"))
    return log, ENDINGS[ending], attempts


def interleavings(
    data: st.DataObject, first: list[events_pb2.Envelope], second: list[events_pb2.Envelope]
) -> list[events_pb2.Envelope]:
    """Both lists merged, each kept in its own order."""
    picks = data.draw(st.permutations([0] * len(first) + [1] * len(second)), label="merge")
    sources = [iter(first), iter(second)]
    return [next(sources[pick]) for pick in picks]


@settings(deadline=None)
@given(requeue_histories(), st.data())
def test_requeues_tolerate_any_interleaving_of_the_two_topics(
    history: tuple[Topics, types_pb2.JobState.ValueType, int], data: st.DataObject
) -> None:
    log, state, attempts = history
    as_happened = folded_job(log.happened)
    assert (as_happened.state, as_happened.attempts) == (state, attempts)
    arrived = interleavings(data, log.events, log.decisions)
    assert folded_job(arrived) == as_happened
    # A consumer that restarts from earlier offsets reads both topics' tails again.
    tails = [data.draw(st.integers(0, len(t)), label="from") for t in (log.events, log.decisions)]
    redelivered = interleavings(data, log.events[tails[0] :], log.decisions[tails[1] :])
    assert reduce(apply_job_event, redelivered, as_happened) == as_happened


# --- listing --------------------------------------------------------------------


def _job(job_id: str, allocation: str, at: float) -> types_pb2.Job:
    return folded_job([submitted(job_id, at=at, s=spec(allocation=allocation))])


def test_newest_jobs_first_filtered_and_limited() -> None:
    jobs = [_job("a", "x", T0), _job("b", "y", T0 + 2), _job("c", "x", T0 + 1)]
    assert [j.job_id for j in newest_jobs(jobs)] == ["b", "c", "a"]
    assert [j.job_id for j in newest_jobs(jobs, where=JobFilter(allocation="x"))] == ["c", "a"]
    assert [j.job_id for j in newest_jobs(jobs, limit=2)] == ["b", "c"]
    assert newest_jobs(jobs, where=JobFilter(allocation="none")) == []


def test_a_filter_picks_by_user_and_state_within_the_scope_never_beyond() -> None:
    mine = _job("mine", "x", T0)
    theirs = folded_job(
        [submitted("theirs", at=T0 + 1, s=types_pb2.JobSpec(allocation="y", user="bo"))]
    )
    running = folded_job([submitted("run", at=T0 + 2, s=spec("x")), placed("run")])
    jobs = [mine, theirs, running]
    by_bo = JobFilter(user="bo")
    assert [j.job_id for j in newest_jobs(jobs, where=by_bo)] == ["theirs"]
    placed_only = JobFilter(states=frozenset({types_pb2.JOB_STATE_PLACED}))
    assert [j.job_id for j in newest_jobs(jobs, where=placed_only)] == ["run"]
    # ada sees her own and allocation x's; asking for bo's jobs shows none of them.
    ada = Scope("ada", frozenset({"x"}))
    assert [j.job_id for j in newest_jobs(jobs, scope=ada)] == ["run", "mine"]
    assert newest_jobs(jobs, where=by_bo, scope=ada) == []
    assert newest_jobs(jobs, where=JobFilter(allocation="y"), scope=ada) == []


def test_an_array_lists_its_elements_alone() -> None:
    jobs = [_job(i, "x", T0) for i in ("a-1f_0", "a-1f_7", "a-1f0_1", "a-2_0", "j-1f")]
    chosen = newest_jobs(jobs, where=JobFilter(array_id="a-1f"))
    assert sorted(j.job_id for j in chosen) == ["a-1f_0", "a-1f_7"]


def test_newest_jobs_default_limit_and_ties() -> None:
    jobs = [_job(f"j{i:03}", "x", T0) for i in range(150)]
    listed = newest_jobs(jobs, limit=0)
    assert len(listed) == 100
    assert listed[0].job_id == "j149"  # same time: ordered by id, also newest-looking first


def where(job: types_pb2.Job) -> list[tuple[str, str, list[int]]]:
    return [(p.task_id, p.node_id, list(p.gpu_indices)) for p in job.placements]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_a_gang_shows_every_node_it_runs_on_whatever_the_order(order: tuple[int, ...]) -> None:
    ranks = [placed("g", f"n{r}", range(8), task=f"g/0.{r}") for r in (0, 1, 2)]
    job = folded_job([submitted("g"), admitted("g"), *(ranks[i] for i in order)])
    assert where(job) == [(f"g/0.{r}", f"n{r}", list(range(8))) for r in (0, 1, 2)]
    assert (job.node_id, list(job.gpu_indices)) == ("n0", list(range(8)))  # its first node


def test_a_gang_of_more_than_ten_nodes_keeps_rank_order() -> None:
    ranks = [placed("g", f"n{r}", [0], task=f"g/0.{r}") for r in range(12)]
    assert [t for t, _, _ in where(folded_job(list(reversed(ranks))))] == [
        f"g/0.{r}" for r in range(12)
    ]


def test_a_requeued_gang_forgets_where_its_last_placement_ran() -> None:
    gang = [placed("g", f"n{r}", [0], task=f"g/0.{r}") for r in (0, 1)]
    stopped = [stop("g", "for team-b", "n0", task="g/0.0"), failed("g", "SIGTERM", task="g/0.0")]
    waiting = folded_job([submitted("g"), *gang, *stopped, requeued("g")])
    assert where(waiting) == []
    again = folded_job(
        [submitted("g"), *gang, *stopped, requeued("g"), placed("g", "n5", [1], task="g/1.0")]
    )
    assert where(again) == [("g/1.0", "n5", [1])]


def test_a_job_on_one_node_has_one_placement() -> None:
    job = folded_job([submitted("j"), placed("j", "n1", [2, 3])])
    assert where(job) == [("j/0", "n1", [2, 3])]


# --- protection and preemption --------------------------------------------------


def test_a_contract_protects_from_the_start_whichever_arrives_first() -> None:
    contract = placed(
        "j", protection=types_pb2.PROTECTION_CONTRACT, protected_for=Duration(seconds=600)
    )
    begun = started("j", at=T0 + 10)
    for events in ([contract, begun], [begun, contract]):
        job = folded_job(events)
        assert job.protection == types_pb2.PROTECTION_CONTRACT
        assert job.protected_until.seconds == int(T0) + 10 + 600
    assert not folded_job([contract]).HasField("protected_until")  # not started yet


def test_a_requeued_job_forgets_how_its_last_placement_was_protected_not_why_it_stopped() -> None:
    by = types_pb2.Preemption(
        job_id="j2", allocation="team-b", rule=types_pb2.PREEMPTION_RULE_BORROWED
    )
    borrowed = placed("j", protection=types_pb2.PROTECTION_BORROWED)
    job = folded_job([borrowed, started("j"), stop("j", "preempted for j2", preemption=by)])
    assert job.protection == types_pb2.PROTECTION_BORROWED
    assert job.preemption == by
    again = folded_job(
        [borrowed, started("j"), stop("j", "x", preemption=by), failed("j"), requeued("j")]
    )
    assert again.state == S.JOB_STATE_PENDING
    assert again.preemption == by  # why it waits again
    assert again.protection == types_pb2.PROTECTION_UNSPECIFIED


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_gang_whose_part_failed_reads_that_parts_exit_code(order: tuple[int, ...]) -> None:
    gang = [placed("g", f"n{r}", [0], task=f"g/0.{r}", spec=spec(gpus=2)) for r in (0, 1)]
    ends = [
        finished("g", node="n0", exit_code=0, task="g/0.0"),
        failed("g", "cannot start", node="n1", exit_code=126, task="g/0.1"),
    ]
    job = folded_job([*gang, *(ends[i] for i in order)])
    assert (job.state, job.exit_code, job.reason) == (S.JOB_STATE_FAILED, 126, "cannot start")


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_a_gang_runs_until_its_last_part_ends(order: tuple[int, ...]) -> None:
    two = spec(gpus=2)
    events = [
        placed("g", "n0", [0], task="g/0.0", spec=two),
        placed("g", "n1", [0], task="g/0.1", spec=two),
        started("g", "n0", task="g/0.0", at=T0 + 1),
        finished("g", node="n0", task="g/0.0", at=T0 + 5),
    ]
    job = folded_job([events[i] for i in order])
    assert job.state == S.JOB_STATE_PLACED  # part 1 has not started, nor ended
    assert [p.state for p in job.placements] == [S.JOB_STATE_FINISHED, S.JOB_STATE_PLACED]
    done = folded_job([*events, finished("g", node="n1", task="g/0.1", at=T0 + 9)])
    assert (done.state, done.finished_at.seconds) == (S.JOB_STATE_FINISHED, int(T0) + 9)


def test_every_node_an_attempt_ran_on_is_kept_for_its_output_in_any_order() -> None:
    history = [*preempted_once(), requeued("j"), placed("j", "n2", task=T1)]
    for events in (history, history[::-1]):
        assert list(folded_job(events).placed_on) == ["n1", "n2"]


# --- a gang lives and dies as one -------------------------------------------------


class Part(TypedDict):
    node: str
    task: str


def part(rank: int) -> Part:
    """Where a gang's part runs: rank r of g's first placement, on node nr."""
    return {"node": f"n{rank}", "task": f"g/0.{rank}"}


def gang_placed(parts: int) -> list[events_pb2.Envelope]:
    """A gang of ``parts`` parts of two GPUs each."""
    whole = spec(gpus=2 * parts)
    return [placed("g", gpus=[0, 1], spec=whole, **part(r)) for r in range(parts)]


@given(
    st.permutations([*gang_placed(3), *(started("g", at=T0 + 3 - r, **part(r)) for r in (0, 1, 2))])
)
def test_a_gang_runs_once_every_part_started(events: list[events_pb2.Envelope]) -> None:
    job: types_pb2.Job | None = None
    for seen, event in enumerate(events, 1):
        job = apply_job_event(job, event)
        assert job is not None
        kinds = [event_type(e) for e in events[:seen]]
        # Any placement tells how many parts the gang has (its GPUs over a part's).
        whole = kinds.count("task_started") == 3 and "task_placed" in kinds
        assert job.state == (S.JOB_STATE_RUNNING if whole else S.JOB_STATE_PLACED)
    assert job is not None and job.started_at.seconds == int(T0) + 1  # from its first start


def test_a_gang_part_seen_without_its_placement_waits_for_the_count() -> None:
    assert folded_job([started("g", **part(0))]).state == S.JOB_STATE_PLACED
    assert folded_job([placed("j"), idle("j")]).state == S.JOB_STATE_RUNNING  # one node: it runs


def test_an_idle_report_before_the_whole_gang_started_still_counts() -> None:
    gang = gang_placed(2)
    report = idle("g", **part(0))
    begun = [started("g", **part(r)) for r in (0, 1)]
    for events in ([*gang, report, *begun], [*gang, *begun, report], [report, *begun, *gang]):
        job = folded_job(events)
        assert (job.state, job.idle) == (S.JOB_STATE_RUNNING, True)
    assert folded_job([*gang, report]).state == S.JOB_STATE_PLACED


FAILED_FIRST = "rank 2 exited with code 3: its gang lives and dies as one"


def gang_failed() -> list[events_pb2.Envelope]:
    """Rank 2 of three fails; placement stops ranks 0 and 1, which exit on the signal."""
    stopped = [stop("g", FAILED_FIRST, cause=GANG_FAILED, at=T0 + 6, **part(r)) for r in (0, 1)]
    return [
        *gang_placed(3),
        *(started("g", at=T0 + 1, **part(r)) for r in range(3)),
        failed("g", "exited with code 3", exit_code=3, at=T0 + 5, **part(2)),
        *stopped,
        failed("g", f"stop requested: {FAILED_FIRST}", exit_code=143, at=T0 + 7, **part(0)),
        failed("g", "killed by SIGTERM", exit_code=-15, at=T0 + 7, **part(1)),
    ]


@settings(deadline=None)
@given(st.permutations(gang_failed()))
def test_a_failed_gang_reads_the_part_that_failed_first_in_any_order(
    events: list[events_pb2.Envelope],
) -> None:
    job = folded_job(events)
    assert (job.state, job.exit_code, job.reason) == (S.JOB_STATE_FAILED, 3, FAILED_FIRST)
    assert job.finished_at.seconds == int(T0) + 7
    assert has_ended(job)


def test_a_gang_ends_failed_with_its_failed_part_until_the_stop_is_seen() -> None:
    without_stops = [e for e in gang_failed() if not e.HasField("task_stop_requested")]
    job = folded_job(without_stops)
    assert (job.state, job.exit_code, job.reason) == (S.JOB_STATE_FAILED, 3, "exited with code 3")


def test_a_gang_times_out_whole() -> None:
    running = [*gang_placed(2), *(started("g", **part(r)) for r in (0, 1))]
    stops = [stop("g", TIMED_OUT, cause=TIME_LIMIT, **part(r)) for r in (0, 1)]
    ends = [failed("g", "SIGTERM", exit_code=143, **part(r)) for r in (0, 1)]
    for events in ([*running, *stops, *ends], [*ends, *running, *stops[::-1]]):
        job = folded_job(events)
        assert (job.state, job.reason, job.exit_code) == (S.JOB_STATE_TIMEOUT, TIMED_OUT, 143)
    assert folded_job([*running, *stops, ends[0]]).state == S.JOB_STATE_RUNNING


GANG_OUTCOMES = {
    "partly_started": S.JOB_STATE_PLACED,
    "running": S.JOB_STATE_RUNNING,
    "finished": S.JOB_STATE_FINISHED,
    "part_failed": S.JOB_STATE_FAILED,
    "timed_out": S.JOB_STATE_TIMEOUT,
}


@dataclass
class GangEnd:
    state: types_pb2.JobState.ValueType
    exit_code: int = 0
    reason: str = ""


@st.composite
def gang_lifecycles(draw: st.DrawFn) -> tuple[list[events_pb2.Envelope], GangEnd]:
    """One gang's events (one placement) in the order written, and how it ends."""
    outcome = draw(st.sampled_from(sorted(GANG_OUTCOMES)))
    parts = draw(st.integers(2, 3))
    clock = iter(range(int(T0), int(T0) + 100))
    whole = spec(gpus=2 * parts)
    events = [submitted("g", at=next(clock), s=whole), admitted("g", at=next(clock), s=whole)]
    events += gang_placed(parts)
    ranks = draw(st.permutations(range(parts)))  # in the order they start, and end
    begun = ranks[: draw(st.integers(0, parts - 1))] if outcome == "partly_started" else ranks
    events += [started("g", at=next(clock), **part(r)) for r in begun]
    if draw(st.booleans()) and begun:
        reporting = draw(st.sampled_from(begun))
        events.append(idle("g", at=next(clock), **part(reporting)))  # one report
    end = GangEnd(GANG_OUTCOMES[outcome])
    codes = [draw(st.sampled_from([143, -15, 0])) for _ in ranks]  # on a stop's signal
    if outcome == "finished":
        events += [finished("g", at=next(clock), **part(r)) for r in ranks]
    elif outcome == "part_failed":
        first, *rest = ranks
        end.exit_code = draw(st.integers(1, 255))
        end.reason = f"rank {first} exited with code {end.exit_code}: its gang lives and dies"
        at = next(clock)
        events.append(failed("g", "oops", exit_code=end.exit_code, at=at, **part(first)))
        events += [
            stop("g", end.reason, cause=GANG_FAILED, at=next(clock), **part(r)) for r in rest
        ]
        for r, code in zip(rest, codes[1:], strict=True):
            # Two nodes' clocks may agree on when a stopped part ended: rank decides then.
            when = draw(st.sampled_from([at, next(clock)])) if r > first else next(clock)
            events.append(failed("g", "SIGTERM", exit_code=code, at=when, **part(r)))
    elif outcome == "timed_out":
        end.exit_code, end.reason = codes[0], TIMED_OUT  # the first to end says it
        events += [stop("g", TIMED_OUT, cause=TIME_LIMIT, at=next(clock), **part(r)) for r in ranks]
        for r, code in zip(ranks, codes, strict=True):
            events.append(failed("g", "SIGTERM", exit_code=code, at=next(clock), **part(r)))
    return events, end


@settings(deadline=None)
@given(gang_lifecycles(), st.data())
def test_a_gang_ends_the_same_in_any_order_and_any_repeats(
    lifecycle: tuple[list[events_pb2.Envelope], GangEnd], data: st.DataObject
) -> None:
    events, end = lifecycle
    in_order = folded_job(events)
    assert GangEnd(in_order.state, in_order.exit_code, in_order.reason) == end
    starts = [e.occurred_at.seconds for e in events if e.HasField("task_started")]
    assert in_order.started_at.seconds == min(starts, default=0)
    reported = any(e.HasField("task_idle") for e in events)
    assert in_order.idle == (reported and end.state in (S.JOB_STATE_PLACED, S.JOB_STATE_RUNNING))
    repeats = data.draw(st.lists(st.sampled_from(events), max_size=4), label="redelivered")
    shuffled = data.draw(st.permutations(events + repeats), label="arrival order")
    assert folded_job(shuffled) == in_order
    assert_never_backwards(shuffled)


@settings(deadline=None)
@given(st.permutations(gang_failed()))
def test_a_failed_gang_reads_the_part_that_failed_on_its_own_whatever_the_clocks(
    events: list[events_pb2.Envelope],
) -> None:
    """A stopped part's node may read an earlier time than the failed part's: the part
    placement did not stop still says why."""
    skewed = []
    for event in events:
        if event.HasField("task_failed") and event.task_failed.exit_code != 3:
            event = events_pb2.Envelope.FromString(event.SerializeToString())
            event.occurred_at.FromSeconds(int(T0) + 2)  # before rank 2 failed, by its clock
        skewed.append(event)
    job = folded_job(skewed)
    assert (job.state, job.exit_code, job.reason) == (S.JOB_STATE_FAILED, 3, FAILED_FIRST)


def test_a_jobs_last_checkpoint_is_kept_over_its_attempts_in_any_order() -> None:
    saves = [
        events_pb2.Envelope(task_checkpointed=events_pb2.TaskCheckpointed(job_id="j", task_id=t))
        for t in ("j/0", "j/1", "j/0")
    ]
    for env, at in zip(saves, (T0 + 5, T0 + 9, T0 + 7), strict=True):
        env.occurred_at.FromSeconds(int(at))
    for events in ([*preempted_once(), *saves], [*saves[::-1], *preempted_once()]):
        assert folded_job(events).checkpointed_at.seconds == int(T0) + 9
