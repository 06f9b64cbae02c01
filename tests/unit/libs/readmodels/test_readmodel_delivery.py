"""Owed and delivered GPU-hours folded from the log, as the console integrates them, in
any order the budget service reads the two topics."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import events_pb2, types_pb2

from libs.readmodels.delivery import REPLAY_EVERY_S, DeliveryLedger, service_levels
from libs.readmodels.jobs import Scope
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    env,
    finished,
    registered,
    requeued,
    submitted,
    tick,
)

HOUR = 3600.0
# Placement's records, on the decisions topic; the rest are on the events topic.
DECISIONS = {"task_placed", "task_lost", "job_requeued", "node_lost", "serving_held"}
DECISIONS |= {"serving_released", "job_cancelled"}


def spec(allocation: str, gpus: int, *, charged: bool = True) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(
        allocation=allocation,
        user="ada",
        gpus=gpus,
        command=["train"],
        min_runtime=Duration(seconds=600 if charged else 0),
    )


def placed(job: str, s: types_pb2.JobSpec, at: float, attempt: int = 0) -> events_pb2.Envelope:
    task = events_pb2.TaskPlaced(
        job_id=job, task_id=f"{job}/{attempt}", node_id="n1", gpu_indices=range(s.gpus), spec=s
    )
    return env(task, T0 + at)


def submit(job: str, s: types_pb2.JobSpec, at: float) -> list[events_pb2.Envelope]:
    return [submitted(job, T0 + at, s), admitted(job, T0 + at, s)]


def fold(records: list[events_pb2.Envelope], window_s: float = HOUR) -> DeliveryLedger:
    ledger = DeliveryLedger(window_s)
    for record in records:
        ledger.apply(record)
    return ledger


def as_read_at_start(records: list[events_pb2.Envelope]) -> list[events_pb2.Envelope]:
    """The budget service's catch-up: the whole events topic, then the decisions."""
    events = [r for r in records if r.WhichOneof("payload") not in DECISIONS]
    return events + [r for r in records if r.WhichOneof("payload") in DECISIONS]


def gpu_seconds(ledger: DeliveryLedger, shares: dict[str, float]) -> dict[str, tuple[float, ...]]:
    accounts = ledger.timeline(shares).accounts()
    return {
        name: tuple(round(gpu_s, 6) for gpu_s in (a.owed, a.delivered, a.free))
        for name, a in accounts.items()
    }


def history() -> list[events_pb2.Envelope]:
    a, b, free = spec("a", 4), spec("b", 8), spec("a", 2, charged=False)
    return [
        registered("n1", gpus=8, at=T0),
        *submit("ja", a, 100),
        placed("ja", a, 200),
        *submit("jb", b, 300),
        finished("ja", at=T0 + 1100),
        placed("jb", b, 1100),  # waited 800 s for the whole node
        registered("n2", gpus=4, at=T0 + 1150),  # 12 GPUs from then on: 6 each
        *submit("jf", free, 1150),
        placed("jf", free, 1200),
        finished("jf", at=T0 + 1400),
        tick(T0 + 2000),
    ]


def test_owed_is_the_entitled_share_of_what_charged_work_held_or_asked_for() -> None:
    got = gpu_seconds(fold(history()), {"a": 0.5, "b": 0.5})
    # a: asked 4 for 100 s, held 4 for 900 s, entitled to 4; its free job owes nothing.
    assert got["a"] == pytest.approx((4 * 100 + 4 * 900, 4 * 900, 2 * 200))
    # b: asked 8 but entitled to 4 for 800 s; held 8, entitled to 4 then 6.
    assert got["b"] == pytest.approx((4 * 800 + 4 * 50 + 6 * 850, 8 * 900, 0))


def test_the_topics_read_one_after_the_other_give_the_same_hours() -> None:
    shares = {"a": 0.5, "b": 0.5}
    in_time = gpu_seconds(fold(history()), shares)
    assert gpu_seconds(fold(as_read_at_start(history())), shares) == in_time
    assert gpu_seconds(fold(history()[::-1]), shares) == in_time


def test_a_requeued_job_waits_again_and_a_lost_node_owes_nothing_until_it_returns() -> None:
    job = spec("a", 4)

    def node(incarnation: str, at: float) -> events_pb2.Envelope:
        record = registered("n1", gpus=4, at=T0 + at)
        record.node_registered.incarnation = incarnation
        return record

    def lost(incarnation: str, at: float) -> events_pb2.Envelope:
        return env(events_pb2.NodeLost(node_id="n1", incarnation=incarnation), T0 + at)

    task_lost = env(events_pb2.TaskLost(job_id="jr", task_id="jr/0", node_id="n1"), T0 + 500)
    records = [
        node("i1", 0),
        *submit("jr", job, 0),
        placed("jr", job, 10),
        lost("i1", 500),
        task_lost,
        requeued("jr", at=T0 + 500),
        node("i2", 700),
        placed("jr", job, 700, attempt=1),
        lost("i0", 800),  # an earlier incarnation's: changes nothing
        tick(T0 + 1200),
    ]
    for order in (records, as_read_at_start(records)):
        ledger = fold(order, window_s=1000)  # from T0 + 200: its first wait is outside
        # Held 300 s, then 200 s with no GPUs to owe or place on, then held 500 s.
        assert gpu_seconds(ledger, {"a": 1.0}) == {"a": (3200, 3200, 0)}
        assert ledger.timeline({"a": 1.0}).span_s == 1000


def test_a_gpu_serving_holds_is_delivered_once_not_again_for_its_workflow_task() -> None:
    held = events_pb2.ServingHeld(node_id="n1", gpu_index=0, allocation="a")
    task = events_pb2.TaskPlaced(
        job_id="wf",
        task_id="wf/translate",
        node_id="n1",
        gpu_indices=[0],
        spec=spec("a", 1),
        serving=events_pb2.ServingTask(name="translate"),
    )
    records = [
        registered("n1", gpus=4, at=T0),
        env(held, T0 + 10),
        env(task, T0 + 20),
        env(events_pb2.ServingReleased(node_id="n1", gpu_index=0), T0 + 110),
        tick(T0 + 200),
    ]
    owed, delivered, free = gpu_seconds(fold(records), {"a": 1.0})["a"]
    assert (delivered, free) == pytest.approx((100, 0))
    assert owed == pytest.approx(100)


def test_the_report_is_cut_to_the_callers_allocations_in_hours() -> None:
    ledger = fold(history())
    shares = {"a": 0.5, "b": 0.5, "idle": 0.0}
    everything = service_levels(ledger, shares, None)
    assert [level.allocation for level in everything.allocations] == ["a", "b", "idle"]
    a = everything.allocations[0]
    assert (a.owed_gpu_hours, a.allocated_gpu_hours, a.unallocated_gpu_hours) == pytest.approx(
        (4000 / HOUR, 3600 / HOUR, 400 / HOUR)
    )
    assert a.delivered_pct == pytest.approx(90.0)
    assert not everything.allocations[2].HasField("delivered_pct")  # nothing was owed
    assert everything.covered.seconds == 2000 and everything.window.seconds == HOUR
    assert everything.as_of.seconds == int(T0 + 2000)
    member = service_levels(ledger, shares, Scope("ada", frozenset({"b"})))
    assert [level.allocation for level in member.allocations] == ["b"]


def test_a_team_owed_under_the_floor_is_reported_apart_from_the_worst_team() -> None:
    a, c = spec("a", 4), spec("c", 1)
    records = [
        registered("n1", gpus=8, at=T0),  # 16,000 GPU-seconds in 2,000 s: a floor of 16
        *submit("ja", a, 0),
        placed("ja", a, 0),
        *submit("jc", c, 1990),  # c waits 10 s for one GPU: owed 10, under the floor
        tick(T0 + 2000),
    ]
    usage = service_levels(fold(records), {"a": 0.5, "c": 0.5}, None)
    assert [(level.allocation, level.small) for level in usage.allocations] == [
        ("a", False),
        ("c", True),
    ]
    headline = usage.headline
    assert headline.owed_delivered_min_pct == pytest.approx(100.0)
    assert headline.owed_delivered_weighted_pct == pytest.approx(100 * 8000 / 8010)
    small = headline.owed_small_teams
    assert (small.count, small.min_pct) == (1, 0.0)
    assert small.owed_pct == pytest.approx(100 * 10 / 8010)
    # A member of c alone sees c's headline: nobody at the floor, one small team.
    mine = service_levels(fold(records), {"a": 0.5, "c": 0.5}, Scope("ada", frozenset({"c"})))
    assert not mine.headline.HasField("owed_delivered_min_pct")
    assert mine.headline.owed_small_teams.count == 1


def test_what_ended_before_the_window_is_forgotten() -> None:
    job = spec("a", 1)
    records = [registered("n1", gpus=4, at=T0)]
    for i in range(50):
        records += [*submit(f"j{i}", job, 10 * i), placed(f"j{i}", job, 10 * i + 1)]
        records.append(finished(f"j{i}", at=T0 + 10 * i + 5))
    ledger = fold([*records, tick(T0 + 10_000)], window_s=1000)
    assert gpu_seconds(ledger, {"a": 1.0}) == {"a": (0, 0, 0)}
    assert (ledger._jobs, ledger._tasks) == ({}, {})  # memory stays bounded by the window


def test_a_window_is_played_again_only_once_the_log_moved_on_half_a_minute() -> None:
    shares = {"a": 0.5, "b": 0.5}
    ledger = fold(history())
    first = ledger.timeline(shares)
    ledger.apply(tick(T0 + 2000 + REPLAY_EVERY_S - 1))
    assert ledger.timeline(shares) is first and ledger.played_at == T0 + 2000
    ledger.apply(tick(T0 + 2000 + REPLAY_EVERY_S + 1))
    again = ledger.timeline(shares)
    assert again is not first and ledger.played_at == T0 + 2031
    assert service_levels(ledger, shares, None).as_of.seconds == T0 + 2031
    assert ledger.timeline({"a": 1.0}) is not again  # other shares: played for them at once
