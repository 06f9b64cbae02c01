"""What operators and users steer by hand: cordoned and drained nodes, held jobs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core import (
    Cancel,
    CancelRequested,
    JobArrived,
    JobHeld,
    JobUpdated,
    NodeCordoned,
    NodeJoined,
    Place,
    Refused,
    Requeue,
    Scheduler,
    Stop,
    StopCause,
    TaskEnded,
    TaskStarted,
    Tick,
    Wait,
)
from libs.core.capacity import Capacity, Fit, NoFit
from libs.core.ids import JobId, NodeId
from tests.builders import job, node


def placed_on(decisions: list[object]) -> dict[str, str]:
    return {d.job_id: d.node_id for d in decisions if isinstance(d, Place)}


def test_nothing_new_is_placed_on_a_cordoned_node_until_it_is_uncordoned() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    assert s.handle(NodeCordoned(1, "n1", True, requested_by="ops")) == []
    waits = s.handle(JobArrived(2, "j1", job(2)))
    assert placed_on(waits) == {} and any(isinstance(d, Wait) for d in waits)
    assert placed_on(s.handle(NodeCordoned(3, "n1", False))) == {"j1": "n1"}


def test_work_on_a_cordoned_node_runs_on_and_its_gpus_stay_out_of_use() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    s.handle(JobArrived(1, "j1", job(8)))
    s.handle(TaskStarted(2, "j1", "j1/0", "n1"))
    assert s.handle(NodeCordoned(3, "n1", True)) == []  # no stop: it runs on
    s.handle(JobArrived(4, "j2", job(1)))
    assert placed_on(s.handle(TaskEnded(5, "j1", "j1/0", "n1"))) == {}


def test_a_drain_stops_what_runs_there_and_requeues_it_elsewhere_even_if_it_cannot_resume() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    s.handle(JobArrived(1, "j1", job(4, resumable=False, min_runtime_s=3600)))
    s.handle(TaskStarted(2, "j1", "j1/0", "n1"))
    s.handle(NodeJoined(3, node("n2", 8)))
    stops = s.handle(NodeCordoned(4, "n1", True, drain=True, requested_by="ops"))
    assert [(d.task_id, d.cause) for d in stops if isinstance(d, Stop)] == [
        ("j1/0", StopCause.DRAINED)
    ]
    assert "drained by ops" in stops[0].reason  # type: ignore[attr-defined]
    after = s.handle(TaskEnded(5, "j1", "j1/0", "n1", exit_code=-15))
    requeued = [d for d in after if isinstance(d, Requeue)]
    assert requeued and "starts over" in requeued[0].reason
    assert placed_on(after) == {"j1": "n2"}


def test_a_held_job_waits_with_room_to_spare_and_keeps_its_place_when_released() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    s.handle(NodeCordoned(0, "n1", True))
    s.handle(JobArrived(1, "j1", job(8)))
    s.handle(JobArrived(2, "j2", job(8)))
    held = s.handle(JobHeld(3, "j1", True, requested_by="alice"))
    assert [d.reason for d in held if isinstance(d, Wait)] == [
        "held by alice: starts once released (qm release)"
    ]
    explained = s.explain("j1")
    assert explained is not None and "held by alice" in explained.text
    assert placed_on(s.handle(NodeCordoned(4, "n1", False))) == {"j2": "n1"}
    s.handle(TaskEnded(5, "j2", "j2/0", "n1"))  # j1 still held: n1 stays free
    assert placed_on(s.handle(Tick(6))) == {}
    assert placed_on(s.handle(JobHeld(7, "j1", False))) == {"j1": "n1"}


def test_a_released_job_goes_before_later_arrivals() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    s.handle(NodeCordoned(0, "n1", True))
    s.handle(JobArrived(1, "j1", job(8)))
    s.handle(JobHeld(2, "j1", True))
    s.handle(JobArrived(3, "j2", job(8)))
    s.handle(JobHeld(4, "j1", False))
    assert placed_on(s.handle(NodeCordoned(5, "n1", False))) == {"j1": "n1"}


def test_a_held_job_can_be_cancelled() -> None:
    s = Scheduler()
    s.handle(JobArrived(1, "j1", job(8)))
    s.handle(JobHeld(2, "j1", True))
    assert [type(d) for d in s.handle(CancelRequested(3, "j1"))] == [Cancel]
    assert [type(d) for d in s.handle(JobHeld(4, "j1", False))] == [Refused]


def test_what_cannot_be_held_or_cordoned_is_refused_and_changes_nothing() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 8)))
    s.handle(JobArrived(1, "j1", job(1)))  # placed at once
    before = s.digest()
    refusals = (
        JobHeld(2, JobId("j1"), True),
        JobHeld(2, JobId("nope"), True),
        NodeCordoned(2, NodeId("n9"), True),
    )
    for event in refusals:
        assert [type(d) for d in s.handle(event)] == [Refused]
    assert s.digest() == before


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["take", "give", "cordon", "uncordon", "lose", "join"]),
            st.sampled_from(["n0", "n1", "n2"]),
            st.integers(0, 7),
        ),
        max_size=40,
    )
)
def test_capacity_indexes_match_its_state_through_cordons(
    steps: list[tuple[str, str, int]],
) -> None:
    capacity = Capacity()
    for node_id in ("n0", "n1", "n2"):
        capacity.add(node(node_id, 8), ())
    for kind, name, gpu in steps:
        node_id = NodeId(name)
        if kind == "join":  # (re-)registers: its taken GPUs stay taken
            known = node_id in capacity.nodes
            taken = tuple(g for g in range(8) if known and g not in capacity.free(node_id))
            capacity.add(node(name, 8), taken)
        elif node_id not in capacity.nodes and kind in ("take", "give"):
            continue
        elif kind == "take" and gpu in capacity.free(node_id):
            capacity.take(node_id, (gpu,))
        elif kind == "give":
            capacity.give(node_id, (gpu,))
        elif kind in ("cordon", "uncordon"):
            capacity.cordon(node_id, kind == "cordon")
        elif kind == "lose":
            capacity.remove(node_id)
        assert capacity.indexes() == capacity.derived()
        usable = [n for n in capacity.nodes if not capacity.is_cordoned(n)]
        fit = capacity.fit(job(1))
        if any(capacity.free(n) for n in usable):
            assert isinstance(fit, Fit) and fit.tasks[0][0] in usable
        else:
            assert isinstance(fit, NoFit)


def test_an_update_changes_a_waiting_job_and_keeps_its_place() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 4)))
    s.handle(JobArrived(1, "j1", job(8)))  # too big: waits
    s.handle(JobArrived(2, "j2", job(8)))
    assert placed_on(s.handle(JobUpdated(3, JobId("j1"), job(4)))) == {"j1": "n1"}


def test_an_update_is_refused_for_a_running_job_or_a_bad_spec_and_changes_nothing() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1", 4)))
    s.handle(JobArrived(1, "j1", job(1)))  # placed
    s.handle(JobArrived(2, "j2", job(8)))  # waits
    before = s.digest()
    for update in (JobUpdated(3, JobId("j1"), job(2)), JobUpdated(3, JobId("j2"), job(0))):
        assert [type(d) for d in s.handle(update)] == [Refused]
    assert s.digest() == before
