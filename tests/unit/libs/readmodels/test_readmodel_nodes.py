"""The node fold: inventory from registrations, running tasks from placements and ends."""

from __future__ import annotations

from functools import reduce

import pytest
from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.core.approvals import ApprovedKey
from libs.readmodels import (
    apply_job_event,
    apply_node_event,
    approved_key,
    listed,
    node_key,
    nodes_in_cluster,
    without_ended_tasks,
)
from tests.unit.libs.readmodels.folds import folded_node
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    env,
    failed,
    finished,
    pending,
    placed,
    registered,
    requeued,
    started,
    stop,
    submitted,
    tick,
)


def running(node: types_pb2.Node) -> list[tuple[str, str, list[int]]]:
    return [(t.job_id, t.task_id, list(t.gpu_indices)) for t in node.running]


def test_registration_creates_the_node() -> None:
    node = folded_node([registered("n1", gpus=2, cluster="east", at=T0 + 3)])
    assert node.inventory.node_id == "n1"
    assert node.inventory.cluster == "east"
    assert [g.index for g in node.inventory.gpus] == [0, 1]
    assert node.registered_at.seconds == int(T0) + 3
    assert list(node.running) == []


def test_placements_add_and_task_ends_remove_running_tasks() -> None:
    node = folded_node(
        [
            registered("n1"),
            placed("b", "n1", [2, 3]),
            placed("a", "n1", [0]),
            placed("c", "n1", [1]),
            finished("b"),
            failed("c"),
        ]
    )
    assert running(node) == [("a", "a/0", [0])]


def test_a_refused_task_leaves_the_node_that_refused_it() -> None:
    refused = events_pb2.TaskRefused(job_id="w", task_id="w/a", node_id="n1", gpu_index=0)
    node = folded_node([registered("n1"), placed("w", "n1", [0], task="w/a"), env(refused)])
    assert running(node) == []


def test_reregistration_replaces_inventory_and_keeps_running_tasks() -> None:
    node = folded_node([registered("n1", gpus=4), placed("a", "n1", [3]), registered("n1", gpus=8)])
    assert len(node.inventory.gpus) == 8
    assert running(node) == [("a", "a/0", [3])]


def test_placement_on_an_unregistered_node_creates_it() -> None:
    node = folded_node([placed("a", "n9", [0], cluster="west")])
    assert (node.inventory.node_id, node.inventory.cluster) == ("n9", "west")
    assert list(node.inventory.gpus) == []
    assert running(node) == [("a", "a/0", [0])]
    node = folded_node([placed("a", "n9", [0], cluster="west"), registered("n9", cluster="west")])
    assert len(node.inventory.gpus) == 4
    assert running(node) == [("a", "a/0", [0])]


def test_a_repeated_placement_is_not_counted_twice() -> None:
    node = folded_node([registered("n1"), placed("a", "n1", [0]), placed("a", "n1", [0])])
    assert running(node) == [("a", "a/0", [0])]


def test_task_end_on_an_unknown_node_creates_nothing() -> None:
    assert reduce(apply_node_event, [finished("a", node="n5")], None) is None
    assert reduce(apply_node_event, [failed("a", node="n5")], None) is None


def test_task_end_of_an_unknown_task_changes_nothing_but_a_copy() -> None:
    node = folded_node([registered("n1"), placed("a", "n1")])
    after = apply_node_event(node, finished("zzz"))
    assert after == node
    assert after is not node


@pytest.mark.parametrize("envelope", [submitted("j"), pending("j", "x"), tick()])
def test_envelopes_about_no_node_change_nothing(envelope: events_pb2.Envelope) -> None:
    node = folded_node([registered("n1")])
    assert node_key(envelope) is None
    assert apply_node_event(node, envelope) is node


def test_event_without_node_id_is_ignored() -> None:
    assert node_key(placed("a", "")) is None
    assert apply_node_event(None, placed("a", "")) is None


def test_inputs_are_not_mutated() -> None:
    node = folded_node([registered("n1"), placed("a", "n1")])
    before = node.SerializeToString(deterministic=True)
    for event in (finished("a"), placed("b", "n1", [1]), registered("n1", gpus=1)):
        apply_node_event(node, event)
        assert node.SerializeToString(deterministic=True) == before


def test_wrong_node_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="n2"):
        apply_node_event(folded_node([registered("n1")]), registered("n2"))


@st.composite
def node_histories(draw: st.DrawFn) -> tuple[list[events_pb2.Envelope], list[str]]:
    """Registrations, placements and ends of one node, and the task ids left running."""
    jobs = [f"job-{i}" for i in range(draw(st.integers(0, 6)))]
    ended = draw(st.sets(st.sampled_from(jobs))) if jobs else set()
    placements = [placed(j, "n1", [i]) for i, j in enumerate(jobs)]
    ends = [finished(j) if i % 2 else failed(j) for i, j in enumerate(jobs) if j in ended]
    # Any order, except that an end is held back until its placement was seen.
    shuffled = _respecting_ends(draw(st.permutations(placements + ends)))
    for _ in range(draw(st.integers(1, 3))):
        shuffled.insert(draw(st.integers(0, len(shuffled))), registered("n1", gpus=8))
    still_running = sorted(f"{j}/0" for j in jobs if j not in ended)
    return shuffled, still_running


def _respecting_ends(events: list[events_pb2.Envelope]) -> list[events_pb2.Envelope]:
    placed_jobs: set[str] = set()
    held: dict[str, events_pb2.Envelope] = {}
    out: list[events_pb2.Envelope] = []
    for e in events:
        kind = e.WhichOneof("payload")
        if kind == "task_placed":
            out.append(e)
            placed_jobs.add(e.task_placed.job_id)
            if e.task_placed.job_id in held:
                out.append(held.pop(e.task_placed.job_id))
            continue
        job_id = e.task_finished.job_id if kind == "task_finished" else e.task_failed.job_id
        if job_id in placed_jobs:
            out.append(e)
        else:
            held[job_id] = e
    return out


@given(node_histories())
def test_running_tasks_are_those_placed_and_not_ended(
    history: tuple[list[events_pb2.Envelope], list[str]],
) -> None:
    events, still_running = history
    node = folded_node(events)
    assert [t.task_id for t in node.running] == still_running
    assert len(node.inventory.gpus) == 8


def job(events: list[events_pb2.Envelope]) -> types_pb2.Job | None:
    return reduce(apply_job_event, events, None)


def test_an_end_read_before_its_placement_leaves_a_task_the_jobs_settle() -> None:
    node = folded_node(
        [registered("n1"), finished("a"), placed("a", "n1", [0]), placed("b", "n1", [1])]
    )
    assert [t.task_id for t in node.running] == ["a/0", "b/0"]  # the fold alone cannot know
    jobs = {"a": job([finished("a"), placed("a", "n1", [0])]), "b": job([placed("b", "n1", [1])])}
    settled = without_ended_tasks(node, jobs.get)
    assert running(settled) == [("b", "b/0", [1])]
    assert [t.task_id for t in node.running] == ["a/0", "b/0"]  # input untouched


def test_a_task_stopped_by_preemption_ends_and_the_next_one_is_another_task() -> None:
    node = folded_node(
        [
            registered("n1"),
            placed("j", "n1", [0]),
            failed("j", "SIGTERM", exit_code=143),
            placed("j", "n1", [1], task="j/1"),
        ]
    )
    assert running(node) == [("j", "j/1", [1])]


def test_a_requeued_jobs_older_task_read_late_is_settled() -> None:
    # The old task's end came before its placement; the job has moved on to j/1.
    node = folded_node(
        [registered("n1"), failed("j"), placed("j", "n1", [0]), placed("j", "n1", [1], task="j/1")]
    )
    history = [placed("j"), started("j"), stop("j", "for team-b"), requeued("j")]
    moved_on = job([*history, placed("j", "n1", [1], task="j/1")])
    assert running(without_ended_tasks(node, {"j": moved_on}.get)) == [("j", "j/1", [1])]
    waiting = job(history)
    assert running(without_ended_tasks(node, {"j": waiting}.get)) == [("j", "j/1", [1])]


def test_tasks_of_running_or_unknown_jobs_are_kept() -> None:
    node = folded_node([registered("n1"), placed("a", "n1", [0]), placed("b", "n1", [1])])
    assert without_ended_tasks(node, {"a": job([placed("a", "n1", [0])])}.get) is node


def test_nodes_in_cluster_sorted_by_id() -> None:
    nodes = [
        folded_node([registered("n3", cluster="east")]),
        folded_node([registered("n1", cluster="west")]),
        folded_node([registered("n2", cluster="east")]),
    ]
    assert [n.inventory.node_id for n in nodes_in_cluster(nodes)] == ["n1", "n2", "n3"]
    assert [n.inventory.node_id for n in nodes_in_cluster(nodes, cluster="east")] == ["n2", "n3"]
    assert nodes_in_cluster(nodes, cluster="north") == []


def incarnated(node: str, incarnation: str) -> events_pb2.Envelope:
    env = registered(node)
    env.node_registered.incarnation = incarnation
    return env


def lost(node: str, incarnation: str) -> events_pb2.Envelope:
    env = tick()
    env.node_lost.CopyFrom(
        events_pb2.NodeLost(node_id=node, incarnation=incarnation, reason="no heartbeat")
    )
    return env


def task_lost(job: str, node: str = "n1") -> events_pb2.Envelope:
    env = tick()
    env.task_lost.CopyFrom(events_pb2.TaskLost(job_id=job, task_id=f"{job}/0", node_id=node))
    return env


def test_a_lost_node_is_marked_until_its_agent_registers_again() -> None:
    node = folded_node([incarnated("n1", "a"), placed("j1"), lost("n1", "a"), task_lost("j1")])
    assert (node.lost, node.lost_reason, running(node)) == (True, "no heartbeat", [])
    again = folded_node([incarnated("n1", "a"), lost("n1", "a"), incarnated("n1", "b")])
    assert (again.lost, again.incarnation) == (False, "b")


def test_a_loss_declared_for_an_earlier_incarnation_changes_nothing() -> None:
    node = folded_node([incarnated("n1", "a"), incarnated("n1", "b"), lost("n1", "a")])
    assert not node.lost and node.incarnation == "b"


def test_the_gpus_serving_holds_are_kept_by_index_until_released() -> None:
    def held(index: int, allocation: str) -> events_pb2.Envelope:
        return env(events_pb2.ServingHeld(node_id="n1", gpu_index=index, allocation=allocation))

    released = env(events_pb2.ServingReleased(node_id="n1", gpu_index=2, allocation="vision"))
    node = folded_node(
        [registered("n1"), held(2, "vision"), held(0, "vision"), held(0, "lang"), released]
    )
    assert [(g.gpu_index, g.allocation) for g in node.serving] == [(0, "lang")]
    assert node_key(released) == "n1"


KEY, OTHER = b"k" * 32, b"o" * 32


def approval(node: str, key: bytes = KEY, cluster: str = "default") -> events_pb2.Envelope:
    return env(events_pb2.NodeApproved(node_id=node, public_key=key, approved_by="op"), T0, cluster)


def revocation(node: str) -> events_pb2.Envelope:
    return env(events_pb2.NodeRevoked(node_id=node, revoked_by="op"))


def test_an_approval_before_the_registration_keeps_the_key_alone_unlisted() -> None:
    alone = folded_node([approval("n1", cluster="east")])
    assert (alone.inventory.node_id, alone.inventory.cluster) == ("n1", "east")
    assert approved_key(alone) == ApprovedKey(KEY)
    assert not listed(alone)
    assert nodes_in_cluster([alone]) == [] and nodes_in_cluster([alone], cluster="east") == []
    registered_after = apply_node_event(alone, registered("n1", cluster="east"))
    assert registered_after is not None and listed(registered_after)
    assert approved_key(registered_after) == ApprovedKey(KEY)
    assert nodes_in_cluster([registered_after], cluster="east") == [registered_after]


def test_a_revocation_marks_the_key_and_a_new_approval_replaces_it() -> None:
    events = [registered("n1"), approval("n1"), revocation("n1")]
    assert approved_key(folded_node(events)) == ApprovedKey(KEY, revoked=True)
    assert approved_key(folded_node([*events, approval("n1", OTHER)])) == ApprovedKey(OTHER)
    assert approved_key(folded_node([registered("n1")])) is None
    assert approved_key(None) is None


def test_what_placement_refuses_of_approvals_changes_nothing() -> None:
    node = folded_node([registered("n1")])
    assert apply_node_event(node, approval("n1", b"short")) is node
    assert apply_node_event(node, revocation("n1")) is node  # nothing approved to revoke
    assert apply_node_event(None, revocation("n1")) is None
    assert node_key(approval("n1")) == node_key(revocation("n1")) == "n1"
