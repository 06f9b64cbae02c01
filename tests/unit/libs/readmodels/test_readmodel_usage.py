"""The usage fold: charges from the task lifecycle, the log's clock, snapshots and balances."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.core.approvals import ApprovedKey
from libs.events import new_envelope
from libs.events.wire_time import duration_ms
from libs.readmodels import ClusterUsage, UsageLedger
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    env,
    failed,
    finished,
    started,
    tick,
)

HOUR = 3600.0
WEEK = 7 * 24 * HOUR


def contract(
    allocation: str = "team-a", gpus: int = 2, min_runtime_s: int = 600
) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(
        allocation=allocation,
        user="ada",
        gpus=gpus,
        min_runtime=Duration(seconds=min_runtime_s),
        command=["x"],
    )


def budget(at: float = T0, cluster: str = "default", **weights: float) -> events_pb2.Envelope:
    nodes = [types_pb2.BudgetNode(name="lab", weight=1)]
    nodes += [types_pb2.BudgetNode(name=n, parent="lab", weight=w) for n, w in weights.items()]
    tree = types_pb2.BudgetTree(version=1, nodes=nodes)
    return env(events_pb2.BudgetChanged(tree=tree, changed_by="carol", node="lab"), at, cluster)


def folded(*events: events_pb2.Envelope, window_s: float = WEEK) -> ClusterUsage:
    usage = ClusterUsage("default", window_s)
    for event in events:
        usage.apply(event)
    return usage


def charged(usage: ClusterUsage) -> dict[str, tuple[float, float]]:
    return {a: (u.allocated_gpu_s, u.unallocated_gpu_s) for a, u in usage.usage().items()}


def test_an_allocated_task_is_charged_from_start_to_end() -> None:
    usage = folded(
        admitted("j", s=contract(gpus=2)), started("j", at=T0), finished("j", at=T0 + 100)
    )
    assert charged(usage) == {"team-a": (200.0, 0.0)}


def test_unallocated_work_is_counted_apart_and_not_charged() -> None:
    usage = folded(
        admitted("free", s=contract("team-b", gpus=1, min_runtime_s=0)),
        started("free", at=T0),
        failed("free", at=T0 + 30),
    )
    assert charged(usage) == {"team-b": (0.0, 30.0)}
    assert [(b.allocation, b.gpu_seconds) for b in usage.balances().balances] == [("team-b", 0.0)]


def test_running_work_counts_up_to_the_clock() -> None:
    usage = folded(admitted("j", s=contract(gpus=4)), started("j", at=T0), tick(T0 + 10))
    assert charged(usage) == {"team-a": (40.0, 0.0)}
    assert usage.now == T0 + 10


def test_the_clock_is_the_latest_event_time_and_never_goes_back() -> None:
    usage = folded(tick(T0 + 50), admitted("j", at=T0 + 5, s=contract(gpus=1)), started("j", at=T0))
    assert usage.now == T0 + 50
    assert charged(usage) == {"team-a": (50.0, 0.0)}


def test_a_task_is_charged_once() -> None:
    events = [admitted("j", s=contract(gpus=1)), started("j", at=T0), finished("j", at=T0 + 10)]
    again = [*events, finished("j", at=T0 + 20), started("j", at=T0 + 30), tick(T0 + 40)]
    assert charged(folded(*again)) == charged(folded(*events)) == {"team-a": (10.0, 0.0)}


def test_tasks_of_jobs_never_admitted_are_not_charged() -> None:
    assert charged(folded(started("ghost", at=T0), finished("ghost", at=T0 + 10))) == {}


def test_each_task_of_a_requeued_job_is_charged() -> None:
    usage = folded(
        admitted("j", s=contract(gpus=1)),
        started("j", at=T0),
        failed("j", "SIGTERM", at=T0 + 10),
        started("j", at=T0 + 20, task="j/1"),
        finished("j", at=T0 + 25, task="j/1"),
    )
    assert charged(usage) == {"team-a": (15.0, 0.0)}


def test_usage_older_than_the_window_expires() -> None:
    run = [admitted("j", s=contract(gpus=1)), started("j", at=T0), finished("j", at=T0 + HOUR)]
    assert charged(folded(*run, tick(T0 + 2 * HOUR), window_s=3 * HOUR)) == {"team-a": (HOUR, 0.0)}
    assert charged(folded(*run, tick(T0 + 5 * HOUR), window_s=3 * HOUR)) == {"team-a": (0.0, 0.0)}


def test_balances_join_usage_and_entitlements() -> None:
    usage = folded(
        budget(vision=3, nlp=1),
        admitted("j", s=contract("vision", gpus=1)),
        admitted("k", s=contract("orphan", gpus=1)),
        started("j", at=T0),
        started("k", at=T0),
        tick(T0 + 10),
    )
    balances = [(b.allocation, b.entitlement, b.gpu_seconds) for b in usage.balances().balances]
    assert balances == [("nlp", 0.25, 0.0), ("orphan", 0.0, 10.0), ("vision", 0.75, 10.0)]


def test_a_bad_tree_keeps_the_last_good_one() -> None:
    bad = budget(vision=1)
    bad.budget_changed.tree.nodes.add(name="vision", parent="lab", weight=1)  # a duplicate
    usage = folded(budget(vision=1, nlp=1), bad)
    assert [b.entitlement for b in usage.balances().balances] == [0.5, 0.5]


# --- snapshots ------------------------------------------------------------------


def test_nothing_is_due_before_any_usage() -> None:
    assert folded().snapshot_due("projector") is None
    assert folded(tick(T0), admitted("j", s=contract())).snapshot_due("projector") is None
    assert UsageLedger(WEEK).snapshots_due("projector") == []


def test_a_snapshot_is_as_of_the_latest_event() -> None:
    latest = tick(T0 + 10)
    latest.occurred_at.nanos = 123_456_789  # finer than a datetime
    usage = folded(admitted("j", s=contract(gpus=1)), started("j", at=T0), latest)
    due = usage.snapshot_due("projector")
    assert due is not None
    assert due.occurred_at == latest.occurred_at
    assert (due.producer, due.cluster, due.causation_id) == (
        "projector",
        "default",
        latest.event_id,
    )
    assert due.event_id == "default-usage-3-w604800"
    assert due.usage_snapshot.window == Duration(seconds=int(WEEK))
    [line] = due.usage_snapshot.usage
    assert line.allocation == "team-a"
    assert line.allocated_gpu_s == pytest.approx(10.123456789)


def test_an_unchanged_snapshot_is_not_due_again() -> None:
    usage = folded(admitted("j", s=contract(gpus=1)), started("j", at=T0), finished("j", at=T0 + 5))
    due = usage.snapshot_due("projector")
    assert due is not None
    usage.sent(due.usage_snapshot)
    assert usage.snapshot_due("projector") is None
    usage.apply(tick(T0 + 60))  # time passes, nothing runs: the usage is the same
    assert usage.snapshot_due("projector") is None
    usage.apply(admitted("k", at=T0 + 61, s=contract(gpus=1)))
    usage.apply(started("k", at=T0 + 61))
    usage.apply(tick(T0 + 62))
    assert usage.snapshot_due("projector") is not None


def test_a_restart_does_not_repeat_the_last_snapshot_in_the_log() -> None:
    log = [admitted("j", s=contract(gpus=1)), started("j", at=T0), finished("j", at=T0 + 5)]
    before = folded(*log).snapshot_due("projector")
    assert before is not None
    after_restart = folded(*log, before, tick(T0 + 9))
    assert after_restart.snapshot_due("projector") is None


def test_snapshots_read_back_late_do_not_hide_newer_usage() -> None:
    usage = folded(admitted("j", s=contract(gpus=1)), started("j", at=T0), tick(T0 + 1))
    first = usage.snapshot_due("projector")
    assert first is not None
    usage.sent(first.usage_snapshot)
    usage.apply(tick(T0 + 2))
    second = usage.snapshot_due("projector")
    assert second is not None
    usage.sent(second.usage_snapshot)
    usage.apply(first)  # our own first snapshot, read back after the second was sent
    assert usage.snapshot_due("projector") is None


def test_the_ledger_keeps_clusters_apart() -> None:
    ledger = UsageLedger(WEEK)
    for event in (
        admitted("e", s=contract("team-a", gpus=1), cluster="east"),
        started("e", at=T0, cluster="east"),
        tick(T0 + 10, cluster="east"),
        tick(T0 + 99, cluster="west"),
        tick(T0 + 20),
    ):
        ledger.apply(event)
    due = ledger.snapshots_due("projector")
    assert [(e.cluster, [u.allocated_gpu_s for u in e.usage_snapshot.usage]) for e in due] == [
        ("east", [10.0])
    ]
    ledger.sent(due[0])
    assert ledger.snapshots_due("projector") == []
    assert ledger.cluster("") is ledger.cluster("default")
    assert ledger.cluster("north") is None


def test_an_envelope_without_cluster_belongs_to_the_default_one() -> None:
    ledger = UsageLedger(WEEK)
    bare = new_envelope(
        events_pb2.ClockTick(), producer="t", occurred=datetime.fromtimestamp(T0, UTC)
    )
    bare.cluster = ""
    ledger.apply(bare)
    default = ledger.cluster("default")
    assert default is not None and default.now == T0


# --- determinism ----------------------------------------------------------------

DAY = 24 * HOUR


def test_a_snapshot_depends_on_the_log_alone_even_where_sums_round() -> None:
    # Past 2**31 GPU-seconds the fractions of event times round away, so a
    # charge dropped because its hour had left the window and one added and
    # later expired differ in the last bits, unless expiry happens where the log says.
    log = [
        admitted("old", s=contract(gpus=1)),
        admitted("done", s=contract(gpus=20_000)),
        started("old", at=T0 + 0.769),
        started("done", at=T0 + 2 * HOUR + 0.873),
        finished("done", at=T0 + 6 * DAY + 0.044),
        tick(T0 + 7 * DAY + 2 * HOUR),
        finished("old", at=T0 + 7 * DAY + 2.5 * HOUR + 0.615),
        tick(T0 + 7 * DAY + 3 * HOUR),
    ]
    watched, left_alone = folded(*log[:6]), folded(*log[:6])
    assert watched.snapshot_due("projector") is not None  # the timer fires here, or not
    for event in log[6:]:
        watched.apply(event)
        left_alone.apply(event)
    assert watched.snapshot_due("projector") == left_alone.snapshot_due("projector")


jobs = st.sampled_from(["a", "b", "c"])
steps = st.lists(
    st.tuples(st.sampled_from(["start", "end", "tick"]), jobs, st.floats(0, DAY)),
    max_size=40,
)


@st.composite
def logs(draw: st.DrawFn) -> list[events_pb2.Envelope]:
    """One cluster's log: three jobs, then starts, ends and ticks at drifting times."""
    log = [
        admitted(j, s=contract(f"team-{j}", gpus=i + 1, min_runtime_s=i * 300))
        for i, j in enumerate(["a", "b", "c"])
    ]
    attempts = dict.fromkeys("abc", 0)
    clock = T0 + draw(st.floats(0, 1))
    for kind, job, advance in draw(steps):
        clock += advance
        task = f"{job}/{attempts[job]}"
        if kind == "start":
            log.append(started(job, at=clock, task=task))
        elif kind == "end":
            log.append(finished(job, at=clock, task=task))
            attempts[job] += 1
        else:
            log.append(tick(clock))
    return log


@settings(deadline=None)
@given(logs(), st.data())
@pytest.mark.parametrize("window_s", [2 * DAY, 2.5 * DAY])
def test_a_snapshot_depends_on_the_log_alone_not_on_when_it_is_taken(
    window_s: float, log: list[events_pb2.Envelope], data: st.DataObject
) -> None:
    asked_at = data.draw(st.sets(st.integers(0, len(log))), label="snapshots taken after")
    watched, left_alone = ClusterUsage("default", window_s), ClusterUsage("default", window_s)
    for index, event in enumerate(log):
        if index in asked_at:
            watched.snapshot_due("projector")
            watched.balances()
        watched.apply(event)
        left_alone.apply(event)
    assert watched.snapshot_due("projector") == left_alone.snapshot_due("projector")


def test_a_workflow_is_charged_by_the_gpus_serving_holds_not_task_by_task() -> None:
    workflow = types_pb2.Workflow(
        name="qa",
        tasks=[
            types_pb2.WorkflowTask(
                task_id="a", model="m", model_mb=1, run_duration=duration_ms(1), in_kb=1, out_kb=1
            )
        ],
    )
    spec = types_pb2.JobSpec(allocation="team-s", user="ada", gpus=1, workflow=workflow)
    ledger = UsageLedger(WEEK)
    for event in (
        admitted("w", s=spec),
        started("w", task="w/a", at=T0 + 1),
        finished("w", task="w/a", at=T0 + 2),
        tick(T0 + 20),
    ):
        ledger.apply(event)
    held = events_pb2.ServingHeld(node_id="n1", gpu_index=3, allocation="team-s")
    ledger.decided(env(held, T0))
    # Another allocation's workflows used it from T0 + 4: the charge moves to them.
    moved = events_pb2.ServingHeld(node_id="n1", gpu_index=3, allocation="team-t")
    ledger.decided(env(moved, T0 + 4))
    released = events_pb2.ServingReleased(node_id="n1", gpu_index=3, allocation="team-t")
    ledger.decided(env(released, T0 + 10))
    usage = ledger.cluster("default")
    assert usage is not None
    # Held 10 s, busy 1 s of it: every second held is charged, the task not again.
    assert charged(usage) == {"team-s": (4.0, 0.0), "team-t": (6.0, 0.0)}


def test_the_ledger_keeps_what_its_gate_judges_by_in_log_order() -> None:
    """Nodes' keys as admission approved and revoked them, and the node each running
    task started on (until that node reports its end), per cluster."""
    key, other = b"k" * 32, b"o" * 32

    def approval(node: str, public_key: bytes, cluster: str = "default") -> events_pb2.Envelope:
        return env(events_pb2.NodeApproved(node_id=node, public_key=public_key), T0, cluster)

    revoke = env(events_pb2.NodeRevoked(node_id="n1"))
    ledger = UsageLedger(WEEK)
    for event in [
        approval("n1", key),
        approval("n2", b"not a key"),
        approval("n3", key, cluster="east"),
        env(events_pb2.NodeRevoked(node_id="n2")),  # nothing approved to revoke
        admitted("j", s=contract()),
        started("j", node="n1", at=T0),
        started("k", node="n1", at=T0),
    ]:
        ledger.apply(event)
    assert ledger.node_key("default", "n1") == ApprovedKey(key)
    assert ledger.node_key("default", "n2") is None
    assert ledger.node_key("default", "n3") is None
    assert ledger.node_key("east", "n3") == ApprovedKey(key)
    assert ledger.node_key("north", "n1") is None
    assert ledger.task_node("default", "j", "j/0") == "n1"
    assert ledger.task_node("east", "j", "j/0") is None
    ledger.apply(started("j", node="n2", at=T0 + 1))  # a second start: the first's node
    ledger.apply(finished("k", node="n1", at=T0 + 1))
    ledger.apply(revoke)
    assert ledger.task_node("default", "j", "j/0") == "n1"
    assert ledger.task_node("default", "k", "k/0") is None
    assert ledger.node_key("default", "n1") == ApprovedKey(key, revoked=True)
    ledger.apply(approval("n1", other))
    assert ledger.node_key("default", "n1") == ApprovedKey(other)
