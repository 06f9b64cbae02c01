"""The chaos run's judges: each finds what it must in a small hand-made log, and only that."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.events import new_envelope
from tests.chaos.invariants import (
    Log,
    Record,
    double_runs,
    duplicate_admissions,
    held_at_end,
    launch_failures,
    lost_jobs,
    replay_holdings,
    reported_conflicts,
    requeued_starts,
    start_delays,
)


class Builder:
    """Events on partition 0 in order; each decision answers the latest event."""

    def __init__(self) -> None:
        self.log = Log()
        self.ms = 0

    def event(self, payload: object) -> Builder:
        self.ms += 10
        offset = len(self.log.events)
        env = new_envelope(payload, producer="test")  # type: ignore[arg-type]
        self.log.events.append(Record(0, offset, self.ms, env))
        return self

    def decision(self, payload: object) -> Builder:
        self.ms += 1
        provenance = types_pb2.Provenance(input_partition=0, input_offset=len(self.log.events) - 1)
        getattr(payload, "provenance").CopyFrom(provenance)  # noqa: B009 (any decision)
        env = new_envelope(payload, producer="placement")  # type: ignore[arg-type]
        self.log.decisions.append(Record(0, len(self.log.decisions), self.ms, env))
        return self

    def admit(self, job_id: str) -> Builder:
        spec = types_pb2.JobSpec(gpus=1, allocation="a", user="u", command=["x"])
        self.event(events_pb2.JobSubmitted(job_id=job_id, spec=spec))
        return self.event(events_pb2.JobAdmitted(job_id=job_id, spec=spec))

    def place(self, task_id: str, gpus: list[int], *, serving: bool = False) -> Builder:
        placed = events_pb2.TaskPlaced(
            job_id=task_id.split("/")[0], task_id=task_id, node_id="n", gpu_indices=gpus
        )
        if serving:
            placed.serving.name = task_id.split("/")[1]
        return self.decision(placed)

    def start(self, task_id: str) -> Builder:
        job_id = task_id.split("/")[0]
        return self.event(events_pb2.TaskStarted(job_id=job_id, task_id=task_id, node_id="n"))

    def finish(self, task_id: str) -> Builder:
        job_id = task_id.split("/")[0]
        return self.event(events_pb2.TaskFinished(job_id=job_id, task_id=task_id, node_id="n"))

    def fail(self, task_id: str, exit_code: int, reason: str, node_id: str = "n") -> Builder:
        job_id = task_id.split("/")[0]
        failed = events_pb2.TaskFailed(
            job_id=job_id, task_id=task_id, node_id=node_id, exit_code=exit_code, reason=reason
        )
        return self.event(failed)

    def tick(self) -> Builder:
        return self.event(events_pb2.ClockTick())


def test_a_gpu_reused_after_its_task_ended_is_no_conflict() -> None:
    b = Builder().admit("j1").place("j1/0", [0, 1]).start("j1/0").finish("j1/0")
    b.admit("j2").place("j2/0", [1]).start("j2/0").finish("j2/0")
    conflicts, held = replay_holdings(b.log)
    assert conflicts == [] and held == {}
    assert reported_conflicts(b.log) == []
    assert held_at_end(b.log) == []
    # Builder time: a decision 1 ms after its input, the next event 10 ms after that.
    assert start_delays(b.log) == {"n": [0.01, 0.01]}


def test_a_batch_task_placed_on_a_held_gpu_is_a_conflict_and_one_never_ended_is_held() -> None:
    b = Builder().admit("j1").place("j1/0", [0, 1]).start("j1/0")
    b.admit("j2").place("j2/0", [1]).start("j2/0")
    conflicts, _ = replay_holdings(b.log)
    assert [str(c) for c in conflicts] == ["n GPU 1: j2/0 placed while held by j1/0"]
    assert [c.subject for c in reported_conflicts(b.log)] == ["n GPU 1"]
    assert [str(f) for f in held_at_end(b.log)] == [
        "n GPU 0: held by j1/0",
        "n GPU 1: held by j1/0, j2/0",
    ]


def test_workflow_tasks_queue_on_a_gpu_but_not_beside_a_batch_task() -> None:
    b = Builder().admit("w").place("w/a", [0], serving=True).place("w/b", [0], serving=True)
    assert replay_holdings(b.log)[0] == []
    b.admit("j").place("j/0", [0])
    assert len(replay_holdings(b.log)[0]) == 1


def test_a_workflow_task_refused_by_its_gpu_holds_it_no_more_once_sent_elsewhere() -> None:
    b = Builder().admit("w").place("w/agg", [0], serving=True)
    refused = events_pb2.TaskRefused(job_id="w", task_id="w/agg", node_id="n", gpu_index=0)
    b.event(refused).place("w/agg", [1], serving=True).start("w/agg").finish("w/agg")
    assert replay_holdings(b.log) == ([], {})
    assert held_at_end(b.log) == []
    # Moved before the refusal came: the refusal names a GPU it no longer holds.
    moved = Builder().admit("w").place("w/agg", [0], serving=True).tick()
    moved.place("w/agg", [1], serving=True).event(refused).start("w/agg")
    assert [str(f) for f in held_at_end(moved.log)] == ["n GPU 1: held by w/agg"]


def test_a_decision_applies_after_the_input_it_answers() -> None:
    """The finish and the next placement come from one input: no conflict."""
    b = Builder().admit("j1").place("j1/0", [0]).start("j1/0").finish("j1/0")
    b.place("j2/0", [0])
    assert replay_holdings(b.log)[0] == []


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10)), min_size=1, max_size=8))
def test_conflicts_are_found_exactly_when_intervals_on_one_gpu_overlap(
    intervals: list[tuple[int, int]],
) -> None:
    """Tasks i hold GPU 0 over [start, start + length) in ticks; placed and ended by the log."""
    spans = {f"j{i}/0": (start, start + length) for i, (start, length) in enumerate(intervals)}
    b = Builder()
    for tick in range(45):
        for task, (_, end) in spans.items():
            if end == tick:
                b.finish(task)
        b.tick()
        for task, (start, _) in spans.items():
            if start == tick:
                b.place(task, [0])
    ordered = sorted(spans.values())
    # Sorted by start: one overlaps an earlier one if it starts before the latest end so far.
    overlapping = any(
        start < max(end for s, end in ordered[:i]) for i, (start, _) in enumerate(ordered) if i
    )
    assert bool(replay_holdings(b.log)[0]) == overlapping


def test_a_task_started_twice_or_two_placements_at_once_run_twice_but_a_gang_does_not() -> None:
    b = Builder().admit("g").start("g/0.0").start("g/0.1")
    assert double_runs(b.log) == []
    b.start("g/0.0")
    b.start("g/1")
    assert [f.subject for f in double_runs(b.log)] == ["g/0.0", "g/1"]


def test_a_job_admitted_twice_is_a_duplicate() -> None:
    b = Builder().admit("j1").admit("j2").admit("j1")
    assert [str(f) for f in duplicate_admissions(b.log)] == ["j1: admitted 2 times"]


def test_lost_jobs_are_those_never_admitted_or_stuck_but_not_those_waiting_with_a_reason() -> None:
    b = Builder().admit("done").place("done/0", [0]).start("done/0").finish("done/0")
    b.admit("waits").decision(events_pb2.JobPending(job_id="waits", reason="no free GPU"))
    b.admit("stuck").place("stuck/0", [1]).start("stuck/0")
    b.event(events_pb2.JobSubmitted(job_id="half", spec=types_pb2.JobSpec(gpus=1)))
    found = {f.subject: f.why for f in lost_jobs(["done", "waits", "stuck", "half", "none"], b.log)}
    assert found == {
        "half": "accepted, but never admitted; the log has: job_submitted",
        "none": "accepted, but never admitted; the log has: nothing",
        "stuck": "still RUNNING on n ''",
    }


def test_an_attempt_that_failed_without_starting_on_a_process_node_is_a_launch_failure() -> None:
    b = Builder().admit("j").place("j/0", [0]).start("j/0").fail("j/0", -15, "drained")
    b.place("j/1", [0]).fail("j/1", 126, "cannot open the task log: Permission denied")
    b.admit("other").place("other/0", [1]).fail("other/0", 127, "command not found: x")
    b.admit("elsewhere").place("elsewhere/0", [2]).fail("elsewhere/0", 126, "x", node_id="m")
    found = launch_failures(b.log, ["j", "elsewhere"], ["n"])
    assert [str(f) for f in found] == [
        "j/1: never started on n: exit 126: cannot open the task log: Permission denied"
    ]
    assert requeued_starts(b.log, ["n"]) == 0
    b.start("j/1")
    assert launch_failures(b.log, ["j"], ["n"]) == [] and requeued_starts(b.log, ["n"]) == 1
