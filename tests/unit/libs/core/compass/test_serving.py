"""Workflows through the scheduler: plan on arrival, send when ready, adjust, share with batch."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core import (
    BudgetSet,
    Cancel,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    JobSpec,
    ModelLoaded,
    NodeHeartbeat,
    NodeJoined,
    NodeSpec,
    PeerArrived,
    PeerPlaced,
    PeerPlanned,
    PeerTask,
    Place,
    Planned,
    PolicyConfig,
    Refused,
    Scheduler,
    ServingHeld,
    ServingReleased,
    Stop,
    TaskEnded,
    TaskLost,
    TaskRefused,
    TaskStarted,
    Tick,
    UsageSnapshot,
    Wait,
)
from libs.core.compass import Task, Workflow, build_workflow
from libs.core.compass.backlog import Backlogs
from tests.builders import job, tree

GIB_80 = 80.0
CHAIN = build_workflow(
    "chain",
    [
        Task("a", "llm", 5000, 500, 1, 1),
        Task("b", "tts", 2000, 100, 1, 1, ("a",)),
    ],
    gpu_memory_mb=1e9,
)
FAN = build_workflow(
    "fan",
    [
        Task("root", "llm", 5000, 100, 1, 1),
        Task("x", "vit", 1000, 100, 1, 1, ("root",)),
        Task("y", "vit", 1000, 100, 1, 1, ("root",)),
        Task("join", "", 0, 1, 1, 1, ("x", "y")),
    ],
    gpu_memory_mb=1e9,
)


def gpu_node(node_id: str, gpus: int = 1) -> NodeSpec:
    return NodeSpec(node_id, "H100", tuple(range(gpus)), GIB_80)


def flow(workflow: Workflow = CHAIN) -> JobSpec:
    return job(1, workflow=workflow)


def run(scheduler: Scheduler, inputs: list[Input]) -> list[Decision]:
    out: list[Decision] = []
    for event in inputs:
        out += scheduler.handle(event)
    return out


def places(decisions: list[Decision]) -> list[Place]:
    return [d for d in decisions if isinstance(d, Place) and d.serving is not None]


def test_a_workflow_is_planned_on_arrival_and_its_roots_sent_at_once() -> None:
    s = Scheduler()
    out = run(s, [NodeJoined(0, gpu_node("n1")), JobArrived(1, "w1", flow())])
    [plan] = [d for d in out if isinstance(d, Planned)]
    assert plan.mode == "compass"
    assert [(t.name, t.node_id, t.gpu_index) for t in plan.tasks] == [
        ("a", "n1", 0),
        ("b", "n1", 0),
    ]
    # The first task pays its model's load; the estimate says so.
    assert plan.tasks[0].load_ms == pytest.approx(5000 / 10.171)
    [sent] = places(out)
    assert (sent.task_id, sent.node_id, sent.gpu_indices) == ("w1/a", "n1", (0,))
    assert sent.serving is not None
    assert sent.serving.upcoming == ("tts",)  # look-ahead for the GPU's cache


def test_a_successor_is_sent_when_its_parent_ends_and_the_flow_then_ends() -> None:
    s = Scheduler()
    run(s, [NodeJoined(0, gpu_node("n1")), JobArrived(1, "w1", flow())])
    out = run(s, [TaskStarted(1.5, "w1", "w1/a", "n1"), TaskEnded(2, "w1", "w1/a", "n1")])
    [sent] = places(out)
    assert sent.task_id == "w1/b"
    assert sent.serving is not None and sent.serving.planned is None
    run(s, [TaskEnded(2.2, "w1", "w1/b", "n1")])
    assert s.explain("w1") is None  # nothing left of it


def test_a_model_that_is_resident_steers_the_plan() -> None:
    s = Scheduler()
    out = run(
        s,
        [
            NodeJoined(0, gpu_node("n1")),
            NodeJoined(0, gpu_node("n2")),
            ModelLoaded(0.5, "n2", 0, "llm", 5000),
            JobArrived(1, "w1", flow()),
        ],
    )
    [plan] = [d for d in out if isinstance(d, Planned)]
    assert plan.tasks[0].node_id == "n2"
    assert plan.tasks[0].load_ms == 0


def test_compass_adjusts_a_ready_task_whose_planned_gpu_is_backed_up() -> None:
    s = Scheduler(PolicyConfig(adjust_threshold=1.5))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w1", flow(FAN))])
    # The root runs far longer than planned while another workflow queues
    # behind it; x and y were planned next to it on GPU 0 or 1.
    run(s, [TaskStarted(1, "w1", "w1/root", "n1")])
    for i in range(6):
        run(s, [JobArrived(1.01 + i / 100, f"q{i}", flow(CHAIN))])
    out = run(s, [TaskEnded(1.2, "w1", "w1/root", "n1")])
    sent = {p.serving.name: p for p in places(out) if p.serving is not None}
    assert set(sent) == {"x", "y"}
    moved = [p for p in sent.values() if p.serving is not None and p.serving.planned is not None]
    assert all("exceeds 1.5×" in p.serving.reason for p in moved if p.serving is not None)


def test_heft_never_adjusts() -> None:
    s = Scheduler(PolicyConfig(serving_mode="heft"))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w1", flow(FAN))])
    for i in range(6):
        run(s, [JobArrived(1.01 + i / 100, f"q{i}", flow(CHAIN))])
    out = run(s, [TaskEnded(1.2, "w1", "w1/root", "n1")])
    assert all(p.serving is not None and p.serving.planned is None for p in places(out))


def test_serving_holds_gpus_from_batch_work_until_its_queue_drains_and_lingers() -> None:
    s = Scheduler(PolicyConfig(serving_linger_s=30))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w1", flow())])
    out = run(s, [JobArrived(2, "b1", job(2, min_runtime_s=3600))])
    assert not [d for d in out if isinstance(d, Place)]  # one GPU serves w1
    run(s, [TaskEnded(3, "w1", "w1/a", "n1"), TaskEnded(4, "w1", "w1/b", "n1")])
    assert not [d for d in run(s, [Tick(20)]) if isinstance(d, Place)]  # lingering
    out = run(s, [Tick(40)])
    assert [(d.job_id, d.gpu_indices) for d in out if isinstance(d, Place)] == [("b1", (0, 1))]


def test_a_workflow_waits_for_a_gpu_free_of_batch_work_then_goes_first() -> None:
    s = Scheduler()
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "b1", job(2, min_runtime_s=60))])
    out = run(s, [JobArrived(2, "w1", flow()), JobArrived(3, "b2", job(2, min_runtime_s=60))])
    waits = {d.job_id: d.reason for d in out if isinstance(d, Wait)}
    assert waits["w1"].startswith("waiting for a GPU free of batch work")
    explanation = s.explain("w1")
    assert explanation is not None and explanation.waiting
    out = run(s, [TaskEnded(100, "b1", "b1/0", "n1")])
    assert [type(d).__name__ for d in out][:3] == ["ServingHeld", "Planned", "Place"]
    assert not [d for d in out if isinstance(d, Place) and d.job_id == "b2"]


def test_serving_never_takes_more_than_its_share() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=0.5))
    run(s, [NodeJoined(0, gpu_node("n1", 4))])
    out = run(s, [JobArrived(1 + i, f"w{i}", flow(FAN)) for i in range(4)])
    gpus = {(d.node_id, d.gpu_indices) for d in out if isinstance(d, Place)}
    planned = {(t.node_id, t.gpu_index) for d in out if isinstance(d, Planned) for t in d.tasks}
    assert len(planned) <= 2 and len(gpus) <= 2


def test_cancelling_a_workflow_stops_what_was_sent_and_drops_the_rest() -> None:
    s = Scheduler()
    run(s, [NodeJoined(0, gpu_node("n1")), JobArrived(1, "w1", flow())])
    out = run(s, [CancelRequested(2, "w1")])
    assert [type(d) for d in out] == [Cancel, Stop]
    out = run(s, [TaskEnded(3, "w1", "w1/a", "n1", exit_code=-15)])
    assert not places(out)
    assert s.explain("w1") is None


def test_a_failed_task_ends_its_workflow() -> None:
    s = Scheduler()
    run(s, [NodeJoined(0, gpu_node("n1")), JobArrived(1, "w1", flow())])
    out = run(s, [TaskEnded(2, "w1", "w1/a", "n1", exit_code=1)])
    assert not places(out) and s.explain("w1") is None


def test_the_same_inputs_give_the_same_decisions_and_digest() -> None:
    inputs: list[Input] = [NodeJoined(0, gpu_node(f"n{i}", 2)) for i in range(3)]
    inputs += [JobArrived(1 + i / 10, f"w{i}", flow(FAN if i % 2 else CHAIN)) for i in range(8)]
    inputs += [TaskEnded(2, "w0", "w0/a", "n0"), ModelLoaded(2.1, "n1", 1, "vit", 1000)]
    first, second = Scheduler(), Scheduler()
    assert run(first, inputs) == run(second, inputs)
    assert first.digest() == second.digest()
    third = Scheduler()
    run(third, inputs[:-1])
    assert third.digest() != first.digest()  # the cache view is part of the state


def test_a_workflow_no_gpu_can_hold_waits_without_blocking_the_next() -> None:
    huge = build_workflow("huge", [Task("a", "giant", 500_000, 10, 1, 1)], gpu_memory_mb=1e9)
    s = Scheduler()
    out = run(s, [NodeJoined(0, gpu_node("n1")), JobArrived(1, "w1", flow(huge))])
    [wait] = [d for d in out if isinstance(d, Wait)]
    assert "no registered GPU has that much memory" in wait.reason
    out = run(s, [JobArrived(2, "w2", flow())])
    assert [p.job_id for p in places(out)] == ["w2"]


def test_a_backed_up_pool_takes_the_next_gpu_batch_work_frees() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=0.5, debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 4))])
    run(s, [JobArrived(1, "w0", flow())])  # serving takes one GPU
    run(s, [JobArrived(1.5, "b1", job(3, min_runtime_s=60))])  # batch fills the rest
    assert s.serving_gpus() == 1
    # A stream that queues up behind the one serving GPU.
    run(s, [JobArrived(2 + i / 100, f"w{i + 1}", flow()) for i in range(5)])
    run(s, [JobArrived(3, "b2", job(1, min_runtime_s=60))])  # batch waits for a GPU too
    out = run(s, [TaskEnded(100, "b1", "b1/0", "n1")])
    # The freed GPUs: one joins serving first; batch gets the others.
    assert s.serving_gpus() == 2
    assert [d.job_id for d in out if isinstance(d, Place) and d.serving is None] == ["b2"]


def drain(s: Scheduler, sent: list[Place], at: float) -> list[Decision]:
    """Run every sent task in turn, one GPU's worth at a time; what that decided."""
    out: list[Decision] = []
    while sent:
        task = sent.pop(0)
        assert task.serving is not None
        done = [
            TaskStarted(at, task.job_id, task.task_id, task.node_id),
            TaskEnded(at + task.serving.run_ms / 1000, task.job_id, task.task_id, task.node_id),
        ]
        at += task.serving.run_ms / 1000
        decided = run(s, done)
        sent += places(decided)
        out += decided
    return out


def test_compass_holds_new_workflows_while_the_queues_are_deep_then_plans_them_in_order() -> None:
    # CHAIN's best case is about 600 ms: with hold_threshold 1, a plan whose first
    # task would wait longer than that is held (no load limit: that rule alone).
    s = Scheduler(PolicyConfig(hold_threshold=1, admit_load=0))
    run(s, [NodeJoined(0, gpu_node("n1"))])
    out = run(s, [JobArrived(1 + i / 1000, f"w{i}", flow()) for i in range(4)])
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["w0"]
    waits = {d.job_id: d.reason for d in out if isinstance(d, Wait)}
    assert set(waits) == {"w1", "w2", "w3"}
    assert all(r.startswith("held while the serving GPUs work through") for r in waits.values())
    explanation = s.explain("w3")
    assert explanation is not None and explanation.waiting
    assert "2 workflow(s) ahead of it" in explanation.text
    # As the GPU works through its queue, the held workflows go, oldest first (all
    # are alike: the one due first arrived first).
    out = drain(s, places(out), at=1.5)
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["w1", "w2", "w3"]
    assert all(s.explain(f"w{i}") is None for i in range(4))  # every one finished


@pytest.mark.parametrize(
    ("due_slack", "ahead", "order"), [(1.0, 0, ["s", "w1", "w2"]), (0.0, 2, ["w1", "w2", "s"])]
)
def test_held_workflows_go_earliest_due_first_so_a_short_one_passes_long_ones(
    due_slack: float, ahead: int, order: list[str]
) -> None:
    # Due = arrival + due_slack × best case: with 1, a 50 ms workflow arriving after two
    # 600 ms ones is due 550 ms before them, and goes first when the GPU drains; with
    # 0, due is arrival: oldest first.
    short = build_workflow("short", [Task("only", "", 0, 50, 1, 1)], gpu_memory_mb=1e9)
    s = Scheduler(PolicyConfig(hold_threshold=1, due_slack=due_slack))
    run(s, [NodeJoined(0, gpu_node("n1"))])
    out = run(s, [JobArrived(1 + i / 1000, f"w{i}", flow()) for i in range(3)])
    out += run(s, [JobArrived(1.01, "s", flow(short))])
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["w0"]
    explanation = s.explain("s")
    assert explanation is not None and f"{ahead} workflow(s) ahead of it" in explanation.text
    out = drain(s, places(out), at=1.5)
    assert [d.job_id for d in out if isinstance(d, Planned)] == order


def test_a_load_or_an_eviction_ahead_is_no_reason_to_hold() -> None:
    # 6 GiB: the llm (5,000 MB) must evict the resident tts (2,000 MB), a reload
    # that costs its plan ~200 ms, far over 0.1 × its best case; but nothing queues.
    s = Scheduler(PolicyConfig(hold_threshold=0.1))
    small = NodeSpec("n1", "H100", (0,), 6.0)
    out = run(s, [NodeJoined(0, small), ModelLoaded(0.5, "n1", 0, "tts", 2000)])
    out = run(s, [JobArrived(1, "w1", flow())])
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["w1"]


@pytest.mark.parametrize(
    "config", [PolicyConfig(hold_threshold=0), PolicyConfig(serving_mode="jit")]
)
def test_without_a_hold_every_workflow_is_planned_on_arrival(config: PolicyConfig) -> None:
    s = Scheduler(config)
    run(s, [NodeJoined(0, gpu_node("n1"))])
    out = run(s, [JobArrived(1 + i / 1000, f"w{i}", flow()) for i in range(4)])
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["w0", "w1", "w2", "w3"]


def test_a_held_workflow_holds_back_only_its_own_gpu_type() -> None:
    s = Scheduler(PolicyConfig(hold_threshold=1, serving_max_fraction=1))
    run(s, [NodeJoined(0, gpu_node("h1")), NodeJoined(0, NodeSpec("a1", "A100", (0,), GIB_80))])
    on_h100 = job(1, workflow=CHAIN, gpu_type="H100")
    out = run(s, [JobArrived(1 + i / 1000, f"h{i}", on_h100) for i in range(3)])
    assert [d.job_id for d in out if isinstance(d, Planned)] == ["h0"]
    out = run(s, [JobArrived(1.1, "a0", job(1, workflow=CHAIN, gpu_type="A100"))])
    [plan] = [d for d in out if isinstance(d, Planned)]
    assert plan.job_id == "a0" and {t.node_id for t in plan.tasks} == {"a1"}


def single(name: str, run_ms: float) -> Workflow:
    return build_workflow(name, [Task("only", name, 1000, run_ms, 1, 1)], gpu_memory_mb=1e9)


LONG, SHORT = single("long", 1500), single("short", 100)
# Two GPUs serve 2,000 ms of work a second; queues never hold a workflow here.
OVERLOAD = PolicyConfig(
    hold_threshold=1000,
    admit_load=1.0,
    arrival_window_s=1.0,
    admit_window_s=1.0,
    serving_max_fraction=1,
)


def planned(decisions: list[Decision]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Planned)]


def test_under_overload_the_workflows_with_the_most_work_wait_and_short_ones_go_on() -> None:
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    out = run(s, [JobArrived(1.0, "l0", flow(LONG)), JobArrived(1.01, "s1", flow(SHORT))])
    assert planned(out) == ["l0", "s1"]
    # A second long one would bring the work that arrived to 3,100 ms: it waits.
    out = run(s, [JobArrived(1.02, "l2", flow(LONG))])
    [wait] = [d for d in out if isinstance(d, Wait)]
    assert wait.reason.startswith("held while workflows bring more work than the serving GPUs")
    explanation = s.explain("l2")
    assert explanation is not None and "held while workflows bring more work" in explanation.text
    # Short ones still go (their work and what was admitted fit), past the long one.
    out = run(s, [JobArrived(1.03, "s3", flow(SHORT))])
    assert planned(out) == ["s3"]
    # The load falls with time: the long one goes once the arrivals weigh less.
    out = drain(s, places(out), at=1.5)
    assert planned(out) == [] and "l2" in s._facts.serving.waiting
    out = run(s, [TaskStarted(2.2, "l0", "l0/only", "n1"), TaskEnded(2.6, "l0", "l0/only", "n1")])
    assert planned(out) == ["l2"]


def test_a_workflow_held_for_the_load_goes_at_its_due_time_at_the_latest() -> None:
    # admit_load 0.1: 200 ms of work a second, so the long one waits while anything
    # runs; with due_slack 1 it is due 1.5 s after it arrived, and goes then.
    two_steps = build_workflow(
        "two", [Task("a", "m", 1000, 1000, 1, 1), Task("b", "m", 1000, 1000, 1, 1, ("a",))], 1e9
    )
    s = Scheduler(dataclasses.replace(OVERLOAD, admit_load=0.1, due_slack=1.0))
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    out = run(s, [JobArrived(1.0, "t0", flow(two_steps)), JobArrived(1.01, "l1", flow(LONG))])
    assert planned(out) == ["t0"]
    assert planned(run(s, [TaskStarted(1.1, "t0", "t0/a", "n1")])) == []
    # The first step ends after l1's due time; the second still runs: due, not idle.
    assert planned(run(s, [TaskEnded(2.52, "t0", "t0/a", "n1")])) == ["l1"]


def test_other_planners_arrivals_count_in_the_load() -> None:
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    assert planned(run(s, [JobArrived(1.0, "s0", flow(SHORT))])) == ["s0"]
    assert run(s, [PeerArrived(1.0, "p1", "H100", 1000)]) == []
    # 100 ms of its own, 1,000 of the peer's and its 1,500: past the 2,000 ms the
    # GPUs run in a second (and past this planner's share of it). Alone it goes.
    assert planned(run(s, [JobArrived(1.01, "l1", flow(LONG))])) == []
    alone = Scheduler(OVERLOAD)
    run(alone, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    run(alone, [JobArrived(1.0, "s0", flow(SHORT))])
    assert planned(run(alone, [JobArrived(1.01, "l1", flow(LONG))])) == ["l1"]


def test_among_planners_each_admits_its_share_of_the_work_that_arrived() -> None:
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    assert planned(run(s, [JobArrived(1.0, "s0", flow(SHORT))])) == ["s0"]
    # A peer's 1,900 ms workflow, larger than the long one: no part of its test.
    run(s, [PeerArrived(1.0, "p1", "H100", 1900)])
    # But this planner brought 1,600 of the 3,500 ms that arrived: it admits 46 % of
    # 2,000 ms, and 100 + 1,500 is past that.
    assert planned(run(s, [JobArrived(1.01, "l1", flow(LONG))])) == []
    # A short one fits in its share (200 ms of some 950).
    assert planned(run(s, [JobArrived(1.02, "s2", flow(SHORT))])) == ["s2"]


def test_a_peers_tasks_are_no_work_this_planner_admitted() -> None:
    # Their work counted when they arrived there; its sends are queues here.
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    assert planned(run(s, [JobArrived(1.0, "s0", flow(SHORT))])) == ["s0"]
    run(s, [PeerPlaced(1.0, "p1", PeerTask("p1/x", "n2", 0, "llm", 0, 1900, 1000))])
    assert planned(run(s, [JobArrived(1.01, "l1", flow(LONG))])) == ["l1"]


def test_load_on_one_gpu_type_holds_back_no_workflow_of_another() -> None:
    s = Scheduler(dataclasses.replace(OVERLOAD, serving_max_fraction=1))
    run(s, [NodeJoined(0, gpu_node("h1")), NodeJoined(0, NodeSpec("a1", "A100", (0,), GIB_80))])
    on_h100 = [
        JobArrived(1 + i / 100, f"h{i}", job(1, workflow=LONG, gpu_type="H100")) for i in range(3)
    ]
    assert planned(run(s, on_h100)) == ["h0"]  # one H100 serves 1,000 ms a second
    out = run(s, [JobArrived(1.1, "a0", job(1, workflow=LONG, gpu_type="A100"))])
    assert planned(out) == ["a0"]


@pytest.mark.parametrize(
    "config", [dataclasses.replace(OVERLOAD, admit_load=0), PolicyConfig(serving_mode="jit")]
)
def test_without_a_load_limit_the_long_ones_wait_only_for_queues(config: PolicyConfig) -> None:
    s = Scheduler(config)
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    arrivals = [JobArrived(1 + i / 100, f"l{i}", flow(LONG)) for i in range(3)]
    assert planned(run(s, arrivals)) == ["l0", "l1", "l2"]


@pytest.mark.parametrize("mode", ["compass", "jit"])
def test_kept_timelines_decide_as_timelines_built_afresh_for_every_send(mode: str) -> None:
    # A fan-out sends 40 tasks in one input: serving keeps each GPU's timeline and
    # edits it per send; building them anew for every send must decide the same,
    # with the same digests.
    fan = build_workflow(
        "fan",
        [
            Task("root", "llm", 5000, 100, 1, 1),
            *(Task(f"x{i:02d}", "vit", 1000, 50 + i, 1, 1, ("root",)) for i in range(40)),
        ],
        gpu_memory_mb=1e9,
    )

    def decide_all() -> list[tuple[list[Decision], bytes]]:
        s = Scheduler(PolicyConfig(serving_mode=mode, serving_max_fraction=1.0))
        steps = [NodeJoined(0, gpu_node("n1", 4)), NodeJoined(0, gpu_node("n2", 4))]
        steps += [JobArrived(1, "w1", flow(fan)), JobArrived(1.01, "w2", flow(fan))]
        steps += [TaskStarted(1.02, "w1", "w1/root", "n1"), TaskEnded(1.2, "w1", "w1/root", "n1")]
        return [(s.handle(step), s.digest()) for step in steps]

    kept = decide_all()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Backlogs, "kept", lambda self, now_ms, *keys: {})
        original = Backlogs.line

        def afresh(self: Backlogs, gpu: Any, now_ms: float) -> Any:
            self._lines.pop(gpu.key, None)
            return original(self, gpu, now_ms)

        patch.setattr(Backlogs, "line", afresh)
        assert decide_all() == kept
    sent = [p for p in places(kept[-1][0]) if p.job_id == "w1"]
    assert len(sent) == 40
    assert any(p.serving is not None and p.serving.planned is not None for p in sent)  # moved


# -- lost nodes ---------------------------------------------------------------


def fan_running(s: Scheduler) -> Place:
    """The fan on two one-GPU nodes whose agents heartbeat; its root runs."""
    out = run(
        s,
        [
            NodeJoined(0, gpu_node("n1"), "one", 5),
            NodeJoined(0, gpu_node("n2"), "one", 5),
            JobArrived(1, "w1", flow(FAN)),
        ],
    )
    [root] = places(out)
    s.handle(TaskStarted(1.2, "w1", root.task_id, root.node_id))
    return root


def test_a_workflow_with_a_task_on_a_restarted_node_is_lost() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    root = fan_running(s)
    out = s.handle(NodeJoined(2, gpu_node(root.node_id), "two", 5))
    assert [(type(d).__name__, d.job_id) for d in out][:2] == [
        ("TaskLost", "w1"),
        ("JobLost", "w1"),
    ]
    assert out[1].reason.startswith(f"the node agent on {root.node_id} restarted")  # type: ignore[union-attr]
    # Nothing of it is left to send, and the GPU went back to batch work, free.
    assert s.serving_gpus() <= 1 and s.handle(TaskEnded(3, "w1", root.task_id, root.node_id)) == []
    [place] = s.handle(JobArrived(4, "b1", job(1, min_runtime_s=60)))
    assert isinstance(place, Place) and place.job_id == "b1"


def test_a_workflow_planned_on_a_lost_node_is_lost_and_its_tasks_elsewhere_stopped() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    root = fan_running(s)
    other = "n2" if root.node_id == "n1" else "n1"
    s.handle(TaskEnded(1.3, "w1", root.task_id, root.node_id))  # x and y are sent
    beats = [d for at in range(5, 45, 5) for d in s.handle(NodeHeartbeat(at, root.node_id, "one"))]
    lost = [d for d in beats if d.job_id == "w1"]
    kinds = [type(d).__name__ for d in lost]
    assert kinds[-1] == "JobLost" and "TaskLost" in kinds
    assert all(d.node_id == other for d in lost if isinstance(d, TaskLost))
    assert all(d.node_id == root.node_id for d in lost if isinstance(d, Stop))


def test_a_task_report_from_another_node_is_not_believed() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    root = fan_running(s)
    elsewhere = "n2" if root.node_id == "n1" else "n1"
    assert s.handle(TaskEnded(2, "w1", root.task_id, elsewhere)) == []
    assert places(s.handle(TaskEnded(3, "w1", root.task_id, root.node_id)))  # x, y sent


# -- several planners: another's tasks, read off the log -----------------------------


def peer_task(at: float, run_ms: float = 10_000, **bad: float) -> PeerPlaced:
    """Another planner's task on n1's GPU, its inputs there at 1 s, its model ``llm``."""
    times = {"model_mb": 5000.0, "run_ms": run_ms, "ready_ms": 1000.0, **bad}
    return PeerPlaced(at, "p1", PeerTask("p1/x", "n1", 0, "llm", **times))


def first_start_ms(decisions: list[Decision]) -> float:
    [plan] = [d for d in decisions if isinstance(d, Planned)]
    return plan.tasks[0].start_ms


def test_a_peers_task_counts_in_its_gpus_queue_until_it_ends() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
    run(s, [NodeJoined(0, gpu_node("n1")), peer_task(1)])
    # Its queue holds the peer's 10 s task: the new workflow starts after it.
    assert first_start_ms(s.handle(JobArrived(1, "w1", flow()))) >= 11_000
    assert run(s, [TaskStarted(2, "p1", "p1/x", "n1"), TaskEnded(3, "p1", "p1/x", "n1")]) == []
    # Gone with its end: only w1's two short tasks are ahead now.
    assert first_start_ms(s.handle(JobArrived(3, "w2", flow()))) < 4_000


def test_a_held_back_workflow_waits_for_a_peers_queue_too() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    run(s, [NodeJoined(0, gpu_node("n1")), peer_task(1)])
    out = s.handle(JobArrived(1, "w1", flow()))
    assert [type(d) for d in out] == [Wait]
    assert places(run(s, [TaskStarted(2, "p1", "p1/x", "n1"), TaskEnded(3, "p1", "p1/x", "n1")]))


def test_a_peers_task_on_a_restarted_node_leaves_its_queue() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
    run(s, [NodeJoined(0, gpu_node("n1"), "one", 5), peer_task(1)])
    run(s, [NodeJoined(2, gpu_node("n1"), "two", 5)])
    assert first_start_ms(s.handle(JobArrived(3, "w1", flow()))) < 4_000
    assert s.handle(TaskEnded(4, "p1", "p1/x", "n1")) == []  # late news of it: nothing to do


@pytest.mark.parametrize("bad", [{"run_ms": float("nan")}, {"ready_ms": -1.0}])
def test_a_peer_placement_with_bad_times_is_refused_and_changes_nothing(
    bad: dict[str, float],
) -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    run(s, [NodeJoined(0, gpu_node("n1"))])
    before = s.digest()
    [refused] = s.handle(peer_task(1, **bad))
    assert isinstance(refused, Refused) and "finite" in refused.reason
    assert s.digest() == before


def test_a_peer_task_of_a_job_this_planner_schedules_is_refused() -> None:
    # Else the job's own reports would be taken for the peer's: a batch task's end
    # swallowed, its GPUs never freed.
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    run(s, [NodeJoined(0, gpu_node("n1", 2))])
    [sent] = places(s.handle(JobArrived(1, "w1", flow())))
    [batch] = [d for d in s.handle(JobArrived(1, "b1", job(1))) if isinstance(d, Place)]
    before = s.digest()
    for place in (sent, batch):
        peer = PeerPlaced(1, place.job_id, PeerTask(place.task_id, "n1", 0, "llm", 5000, 500, 1000))
        [refused] = s.handle(peer)
        assert isinstance(refused, Refused) and "a job this planner schedules" in refused.reason
    assert s.digest() == before


@pytest.mark.parametrize("work_ms", [float("nan"), float("inf"), -1.0])
def test_a_peers_arrival_with_bad_work_is_refused_and_changes_nothing(work_ms: float) -> None:
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1"))])
    before = s.digest()
    [refused] = s.handle(PeerArrived(1, "p1", "H100", work_ms))
    assert isinstance(refused, Refused) and "finite" in refused.reason
    assert s.digest() == before


def test_a_peers_arrival_of_a_job_this_planner_schedules_is_refused() -> None:
    s = Scheduler(OVERLOAD)
    run(s, [NodeJoined(0, gpu_node("n1"))])
    run(s, [JobArrived(1, "w1", flow(SHORT))])
    before = s.digest()
    [refused] = s.handle(PeerArrived(1, "w1", "H100", 100))
    assert isinstance(refused, Refused) and "a job this planner schedules" in refused.reason
    assert s.digest() == before


def test_a_peer_task_on_a_gpu_this_planner_does_not_know_changes_nothing() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0))
    run(s, [NodeJoined(0, gpu_node("n1"))])
    before = s.digest()
    assert s.handle(PeerPlaced(1, "p1", PeerTask("p1/x", "n9", 0, "llm", 5000, 500, 1000))) == []
    assert s.digest() == before


def peer_plan(*tasks: tuple[str, str], run_ms: float = 10_000, job_id: str = "p1") -> PeerPlanned:
    """Another planner's plan: each (task, node) a task of ``run_ms`` on the node's GPU,
    expected there at 1 s."""
    return PeerPlanned(
        1,
        job_id,
        tuple(PeerTask(f"{job_id}/{t}", n, 0, "llm", 5000, run_ms, 1000) for t, n in tasks),
    )


def two_gpus() -> Scheduler:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
    run(s, [NodeJoined(0, gpu_node("n1")), NodeJoined(0, gpu_node("n2"))])
    return s


def test_a_peers_planned_tasks_hold_their_gpus_until_it_sends_them_elsewhere() -> None:
    s = two_gpus()
    assert s.handle(peer_plan(("x", "n1"), ("y", "n2"))) == []
    # Both GPUs are promised for 10 s: the new workflow starts after a peer's task.
    assert first_start_ms(s.handle(JobArrived(1, "w1", flow()))) >= 11_000
    # The peer sent x to n2 after all: n1 is free of it.
    run(s, [PeerPlaced(1.1, "p1", PeerTask("p1/x", "n2", 0, "llm", 5000, 10_000, 1000))])
    assert first_start_ms(s.handle(JobArrived(1.1, "w2", flow()))) < 3_000


@pytest.mark.parametrize(
    "gives_up",
    [
        [TaskStarted(1.2, "p1", "p1/x", "n1"), TaskEnded(1.3, "p1", "p1/x", "n1", exit_code=1)],
        [CancelRequested(1.2, "p1")],
        [NodeJoined(1.2, gpu_node("n1"), "two", 5)],  # its agent restarted: x is lost
    ],
    ids=["a task failed", "cancelled", "a task lost"],
)
def test_what_a_peer_planned_and_gave_up_on_leaves_the_queues(gives_up: list[Input]) -> None:
    def after(plan: PeerPlanned, then: list[Input]) -> str:
        s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
        run(s, [NodeJoined(0, gpu_node("n1"), "one", 5), NodeJoined(0, gpu_node("n2"))])
        run(s, [plan, peer_task(1.1, run_ms=100), *then])  # x sent, then perhaps given up on
        return s.digest()

    both, alone = peer_plan(("x", "n1"), ("y", "n2")), peer_plan(("x", "n1"))
    # y, never sent, leaves no trace: as if the peer had planned x alone.
    assert after(both, gives_up) == after(alone, gives_up)
    # Had the peer gone on, y would still hold n2.
    assert after(both, []) != after(alone, [])


def test_a_plan_weighs_every_gpu_its_peers_keep_busy_not_the_first_in_node_order() -> None:
    # Every free GPU serves a peer's work: n1 and n2 for 10 s, n3 for 10 ms.
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
    run(s, [NodeJoined(0, gpu_node(n)) for n in ("n1", "n2", "n3")])
    run(s, [peer_plan(("x", "n1"), ("y", "n2")), peer_plan(("z", "n3"), run_ms=10, job_id="p2")])
    [plan] = [d for d in s.handle(JobArrived(1, "w1", flow())) if isinstance(d, Planned)]
    assert plan.tasks[0].node_id == "n3" and plan.tasks[0].start_ms < 3_000


def test_a_second_word_of_a_peers_plan_changes_nothing() -> None:
    s = two_gpus()
    run(s, [peer_plan(("x", "n1"))])
    before = s.digest()
    assert s.handle(peer_plan(("x", "n1"))) == []
    assert s.digest() == before


@pytest.mark.parametrize(
    "bad",
    [
        peer_plan(("x", "n1"), run_ms=float("nan")),
        peer_plan(("x", "n1"), run_ms=-1),
        PeerPlanned(1, "p1", tuple(PeerTask(f"p1/{i}", "n1", 0, "", 0, 1, 0) for i in range(4097))),
        peer_plan(("x", "n1"), job_id="w1"),  # a job this planner schedules
    ],
    ids=["nan", "negative", "too many tasks", "its own job"],
)
def test_a_bad_peer_plan_is_refused_and_changes_nothing(bad: PeerPlanned) -> None:
    s = two_gpus()
    run(s, [JobArrived(1, "w1", flow())])
    before = s.digest()
    [refused] = s.handle(bad)
    assert isinstance(refused, Refused) and refused.subject == bad.job_id
    assert s.digest() == before


def test_a_peer_naming_this_planners_own_task_changes_nothing() -> None:
    # Else the task's reports would be taken for the peer's, and its successors never sent.
    s = two_gpus()
    [sent] = places(s.handle(JobArrived(1, "w1", flow())))
    before = s.digest()
    own = PeerTask(sent.task_id, "n2", 0, "llm", 5000, 10, 1000)
    assert s.handle(PeerPlanned(1, "p1", (own,))) == []
    assert s.handle(PeerPlaced(1, "p1", own)) == []
    assert s.digest() == before
    [child] = places(
        run(s, [TaskStarted(1.5, "w1", "w1/a", "n1"), TaskEnded(2, "w1", "w1/a", "n1")])
    )
    assert child.task_id == "w1/b"


def test_a_node_whose_agent_keeps_its_caches_otherwise_is_refused_by_name() -> None:
    s = Scheduler(PolicyConfig(serving_cache_model="fifo-cost", hold_threshold=0))
    [refused] = s.handle(NodeJoined(0, gpu_node("n1"), "one", 5, cache_model="lookahead"))
    assert isinstance(refused, Refused) and refused.subject == "n1"
    assert "--cache-model fifo-cost" in refused.reason and "'lookahead'" in refused.reason
    assert not places(s.handle(JobArrived(1, "w0", flow())))  # no GPU to plan on
    # The same model, or an agent that does not say (one from before the field): taken.
    [sent] = places(s.handle(NodeJoined(2, gpu_node("n2"), "one", 5, cache_model="fifo-cost")))
    assert (sent.job_id, sent.node_id) == ("w0", "n2")
    assert run(s, [NodeJoined(2, gpu_node("n3"), "one", 5)]) == []
    assert places(s.handle(JobArrived(3, "w1", flow())))[0].node_id in {"n2", "n3"}


def pool_config(**knobs: Any) -> PolicyConfig:
    """Serving may take every GPU and keeps one warm; its load is the last second's."""
    defaults: dict[str, Any] = {
        "serving_max_fraction": 1.0,
        "serving_reserve": 0,
        "serving_reserve_min": 1,
        "serving_load_window_s": 1,
    }
    return PolicyConfig(**{**defaults, **knobs})


def test_idle_serving_gpus_beyond_the_warm_reserve_go_back_after_the_lend_delay() -> None:
    s = Scheduler(pool_config(serving_linger_s=30, serving_lend_s=2))
    run(s, [NodeJoined(0, gpu_node("n1", 3))])
    run(s, [JobArrived(1, f"w{i}", flow()) for i in range(3)])  # at once: a GPU each
    assert s.serving_gpus() == 3
    run(s, [JobArrived(1.2, "batch", job(2))])
    ends = [TaskEnded(3, f"w{i}", f"w{i}/{t}", "n1") for i in range(3) for t in "ab"]
    run(s, ends)
    run(s, [Tick(4.5)])
    assert s.serving_gpus() == 3  # idle 1.5 s: not yet
    out = run(s, [Tick(5.5)])
    assert [d.job_id for d in out if isinstance(d, Place)] == ["batch"]
    assert s.serving_gpus() == 1  # the warm reserve stays...
    run(s, [Tick(32)])
    assert s.serving_gpus() == 1
    run(s, [Tick(33.5)])
    assert s.serving_gpus() == 0  # ...until it has lingered


def test_the_pool_holds_its_load_through_a_lull_and_gives_it_back_when_the_load_is_gone() -> None:
    config = PolicyConfig(
        serving_max_fraction=1.0,
        serving_lend_s=0.5,
        serving_linger_s=1000,
        serving_reserve=0,  # the load alone
        serving_reserve_min=0,
    )
    s = Scheduler(config)
    run(s, [NodeJoined(0, gpu_node("n1", 2))])
    run(s, [JobArrived(1, "w0", flow()), JobArrived(1, "w1", flow())])  # a GPU each
    run(s, [TaskEnded(10, f"w{i}", f"w{i}/a", "n1") for i in range(2)])
    run(s, [TaskEnded(21, f"w{i}", f"w{i}/b", "n1") for i in range(2)])
    run(s, [JobArrived(21.2, "batch", job(2))])
    # Both drained a second ago, but 2 GPUs were busy for 20 of the last 30 s: a load of
    # 1.33 holds 2 GPUs. The GPUs busy now (none) would have given both back.
    assert [d for d in run(s, [Tick(22)]) if isinstance(d, Place)] == []
    assert s.serving_gpus() == 2
    out = run(s, [Tick(60)])  # nothing busy for a whole window: the load is 0
    assert [d.job_id for d in out if isinstance(d, Place)] == ["batch"]
    assert s.serving_gpus() == 0


def test_gpus_batch_work_leaves_free_count_toward_the_warm_reserve() -> None:
    s = Scheduler(pool_config(serving_lend_s=2))
    run(s, [NodeJoined(0, gpu_node("n1", 3))])
    run(s, [JobArrived(1, f"w{i}", flow()) for i in range(2)])
    ends = [TaskEnded(3, f"w{i}", f"w{i}/{t}", "n1") for i in range(2) for t in "ab"]
    run(s, [*ends, Tick(5.5)])
    assert s.serving_gpus() == 0  # the free GPU is the reserve: both go back


def test_plans_use_the_warm_reserve_not_the_gpus_left_to_drain() -> None:
    s = Scheduler(pool_config(serving_lend_s=100))
    run(s, [NodeJoined(0, gpu_node("n1", 2))])
    out = run(s, [JobArrived(1, "w0", flow()), JobArrived(1, "w1", flow())])
    gpu = {p.job_id: p.gpu_indices for p in places(out)}
    assert gpu == {"w0": (0,), "w1": (1,)}
    # GPU 1 drains last: it is the warm reserve, and GPU 0 (as warm, and first in
    # node order) is left to drain back to batch work.
    run(s, [TaskEnded(3, "w0", "w0/a", "n1"), TaskEnded(3, "w0", "w0/b", "n1")])
    run(s, [TaskEnded(4, "w1", "w1/a", "n1"), TaskEnded(4, "w1", "w1/b", "n1")])
    [sent] = places(run(s, [JobArrived(5, "w2", flow())]))
    assert sent.gpu_indices == (1,)


def test_a_backed_up_pool_with_no_free_gpu_stops_one_free_job_and_takes_its_gpus() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 3)), JobArrived(1, "w0", flow())])
    run(s, [JobArrived(1.5, "free", job(2)), TaskStarted(1.6, "free", "free/0", "n1")])
    run(s, [JobArrived(1.7, "later", job(2))])  # batch work waits for those GPUs too
    assert s.serving_gpus() == 1
    out = run(s, [JobArrived(2 + i / 100, f"w{i + 1}", flow()) for i in range(6)])
    [stop] = [d for d in out if isinstance(d, Stop)]  # one at a time
    assert (stop.job_id, stop.grace_s) == ("free", s.config.free_stop_grace_s)
    assert not s.serving_stalled()  # a job is stopping for it
    assert "workflow serving" in stop.reason
    out = run(s, [TaskEnded(5, "free", "free/0", "n1", exit_code=-15)])
    assert s.serving_gpus() == 3  # both its GPUs: the backlog wants more than one
    assert not [d for d in out if isinstance(d, Place) and d.serving is None]


def test_a_backed_up_pool_stops_the_free_job_that_frees_what_it_lacks() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 4)), JobArrived(1, "w0", flow())])
    for name, gpus in (("one", 1), ("two", 2)):  # free work that resumes: neither loses
        spec = job(gpus, resumable=True)
        run(s, [JobArrived(1.5, name, spec), TaskStarted(1.6, name, f"{name}/0", "n1")])
    assert s.serving_gpus() == 1
    out = run(s, [JobArrived(2 + i / 100, f"w{i + 1}", flow()) for i in range(6)])
    # One busy GPU calls for 1 + 2 √1 = 3: the pool lacks 2, and the 2-GPU job frees
    # both in one grace (batch preemption would stop the smaller one).
    assert [d.job_id for d in out if isinstance(d, Stop)] == ["two"]
    run(s, [TaskEnded(5, "two", "two/0", "n1", exit_code=-15)])
    assert s.serving_gpus() == 3


def test_a_backed_up_pool_stops_no_charged_work_its_contract_protects() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w0", flow())])
    charged = job(1, min_runtime_s=3600)
    run(s, [JobArrived(1.5, "b1", charged), TaskStarted(1.6, "b1", "b1/0", "n1")])
    out = run(s, [JobArrived(2 + i / 100, f"w{i + 1}", flow()) for i in range(6)])
    assert not [d for d in out if isinstance(d, Stop)]
    assert s.serving_gpus() == 1


def test_a_backed_up_pool_with_nothing_it_may_stop_is_stalled_till_batch_work_frees_a_gpu() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w0", flow())])
    charged = job(1, min_runtime_s=3600)
    run(s, [JobArrived(1.5, "b1", charged), TaskStarted(1.6, "b1", "b1/0", "n1")])
    assert not s.serving_stalled()  # not backed up
    run(s, [JobArrived(2 + i / 100, f"w{i + 1}", flow()) for i in range(6)])
    assert s.serving_stalled()  # the only other job's contract protects it
    run(s, [Tick(10)])
    assert s.serving_stalled()  # a pass that finds nothing new leaves it so
    run(s, [TaskEnded(30, "b1", "b1/0", "n1")])
    assert s.serving_gpus() == 2 and not s.serving_stalled()  # it grew onto the GPU


@pytest.mark.parametrize("resumable", [True, False])
def test_a_backed_up_pool_stops_charged_work_it_outranks_past_its_contract_losing_nothing(
    resumable: bool,
) -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    # team-a's serving GPU is charged from t=1, team-b's job from 1.5: a weight of 3
    # keeps team-a ranked first.
    run(s, [BudgetSet(0, tree(**{"team-a": 3, "team-b": 1}))])
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w0", flow())])
    other = job(1, allocation="team-b", min_runtime_s=10, resumable=resumable)
    run(s, [JobArrived(1.5, "b1", other), TaskStarted(1.6, "b1", "b1/0", "n1")])
    out = run(s, [JobArrived(20 + i / 100, f"w{i + 1}", flow()) for i in range(6)])
    stops = [(d.job_id, d.grace_s) for d in out if isinstance(d, Stop)]
    # Past its contract, ranked below team-a; work that cannot resume would be lost.
    assert stops == ([("b1", 0.0)] if resumable else [])


def test_a_backed_up_pool_never_stops_charged_work_that_cannot_resume_even_as_it_starts() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, debug_headroom=0))
    run(s, [BudgetSet(0, tree(**{"team-a": 3, "team-b": 1}))])
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "w0", flow())])
    # Allocated work beyond team-b's share (a quarter of 2 GPUs): borrowed, unprotected.
    run(s, [JobArrived(1.5, "b1", job(1, allocation="team-b", min_runtime_s=3600))])
    # It starts as the backlog arrives: stopping it now throws away no work, but it
    # would end (it cannot resume), not wait to run again.
    run(s, [TaskStarted(20, "b1", "b1/0", "n1")])
    out = run(s, [JobArrived(20, f"w{i + 1}", flow()) for i in range(6)])
    assert not [d for d in out if isinstance(d, Stop)]


def test_a_workflow_on_a_cluster_full_of_free_work_has_a_gpu_freed_for_it() -> None:
    s = Scheduler(PolicyConfig(debug_headroom=0))
    run(s, [NodeJoined(0, gpu_node("n1", 2)), JobArrived(1, "free", job(2))])
    out = run(s, [TaskStarted(1.1, "free", "free/0", "n1"), JobArrived(2, "w1", flow())])
    assert [d.job_id for d in out if isinstance(d, Stop)] == ["free"]
    out = run(s, [TaskEnded(5, "free", "free/0", "n1", exit_code=-15)])
    assert [p.job_id for p in places(out)] == ["w1"]
    assert s.serving_gpus() == 1  # of the two freed, at most serving_max_fraction


def test_a_pool_at_its_cap_plans_on_its_idle_gpu_though_free_ones_are_elsewhere() -> None:
    # Serving may hold one GPU; it drained, and free GPUs elsewhere fill the reserve's
    # count. The next workflow must still be planned on the one GPU it may use.
    s = Scheduler(PolicyConfig(serving_max_fraction=0.25, serving_linger_s=1))
    run(s, [NodeJoined(0, gpu_node("n1", 4)), JobArrived(1, "w1", flow())])
    run(s, [TaskEnded(1.2, "w1", "w1/a", "n1"), TaskEnded(1.3, "w1", "w1/b", "n1")])
    [sent] = places(run(s, [JobArrived(1.4, "w2", flow())]))
    assert (sent.job_id, sent.gpu_indices) == ("w2", (0,))


def holds(decisions: list[Decision]) -> list[Decision]:
    return [d for d in decisions if isinstance(d, ServingHeld | ServingReleased)]


def test_a_serving_gpu_is_charged_from_taken_to_given_back_to_whoever_used_it_last() -> None:
    config = PolicyConfig(
        serving_max_fraction=1.0,
        serving_lend_s=5,
        serving_reserve=0,
        serving_reserve_min=0,
        serving_load_window_s=1,
    )
    s = Scheduler(config)
    run(s, [NodeJoined(0, gpu_node("n1"))])
    out = run(s, [JobArrived(1, "w1", flow())])
    assert holds(out) == [ServingHeld("n1", 0, "team-a")]
    run(s, [TaskEnded(2, "w1", "w1/a", "n1"), TaskEnded(2.1, "w1", "w1/b", "n1")])
    out = run(s, [JobArrived(3, "w2", job(1, allocation="team-b", workflow=CHAIN))])
    assert holds(out) == [ServingHeld("n1", 0, "team-b")]  # the charge moves with the GPU
    assert run(s, [TaskEnded(4, "w2", "w2/a", "n1"), JobArrived(4.1, "w3", flow())]) != []
    out = run(s, [TaskEnded(5, "w3", "w3/a", "n1"), TaskEnded(5.1, "w3", "w3/b", "n1")])
    out += run(s, [TaskEnded(5.2, "w2", "w2/b", "n1"), Tick(9), Tick(10.3)])
    assert holds(out) == [ServingReleased("n1", 0, "team-a")]  # lent back 5 s after
    assert s.serving_gpus() == 0


def over_served_team(reserve_min: int, team_b_weight: int = 1) -> Scheduler:
    """Serving keeps drained GPUs warm (lent back only after 100 s), and team-a used far
    more than team-b this week, so team-b ranks above it."""
    config = PolicyConfig(
        serving_max_fraction=1.0,
        serving_lend_s=100,
        serving_reserve_min=reserve_min,
        debug_headroom=0,
    )
    s = Scheduler(config)
    week = UsageSnapshot(0, 7 * 86400, (("team-a", 1e6),))
    run(s, [BudgetSet(0, tree(**{"team-a": 1, "team-b": team_b_weight})), week])
    return s


def warm_pool_of_an_over_served_team(gpus: int, reserve_min: int) -> Scheduler:
    """team-a's workflows took every GPU of the one node and drained (GPU 0 first): all
    stay warm."""
    s = over_served_team(reserve_min)
    run(s, [NodeJoined(0, gpu_node("n1", gpus))])
    run(s, [JobArrived(1, f"w{i}", flow()) for i in range(gpus)])
    ends = [TaskEnded(2 + i, f"w{i}", f"w{i}/{t}", "n1") for i in range(gpus) for t in "ab"]
    run(s, [*ends, Tick(10)])
    assert s.serving_gpus() == gpus  # kept warm: nothing presses on it yet
    return s


def test_under_budget_pressure_serving_gives_back_the_idle_gpus_beyond_its_share() -> None:
    # Its share is one GPU of two; the one drained last is the warm GPU serving always
    # keeps (serving_reserve_min).
    s = warm_pool_of_an_over_served_team(gpus=2, reserve_min=1)
    run(s, [JobArrived(10.5, "b1", job(1, allocation="team-b", min_runtime_s=7200))])
    out = run(s, [Tick(20)])  # the next preemption round
    assert holds(out) == [ServingReleased("n1", 0, "team-a")]  # the one beyond its share
    assert [d.job_id for d in out if isinstance(d, Place)] == ["b1"]
    # team-a holds its share now: its last warm GPU stays, and team-b's next job waits.
    out = run(s, [JobArrived(21, "b2", job(1, allocation="team-b", min_runtime_s=7200))])
    out += run(s, [Tick(30)])  # a round: nothing for it
    assert holds(out) == [] and not any(isinstance(d, Place) for d in out)
    assert s.serving_gpus() == 1


def test_budget_pressure_never_takes_the_warm_gpus_serving_always_keeps() -> None:
    s = warm_pool_of_an_over_served_team(gpus=3, reserve_min=2)  # its share is 1.5
    batch = job(1, allocation="team-b", min_runtime_s=7200)
    run(s, [JobArrived(10.5, "b1", batch), JobArrived(10.6, "b2", batch)])
    out = run(s, [Tick(20), Tick(30)])
    # The GPU drained first goes to b1; the two drained last are serving's contract.
    assert holds(out) == [ServingReleased("n1", 0, "team-a")]
    assert [d.job_id for d in out if isinstance(d, Place)] == ["b1"]
    assert s.serving_gpus() == 2


def test_budget_pressure_passes_over_a_job_no_node_may_take() -> None:
    # No node has its GPU type: serving has nothing to give it, and the pass goes on.
    s = warm_pool_of_an_over_served_team(gpus=2, reserve_min=0)
    other = job(1, allocation="team-b", min_runtime_s=7200, gpu_type="A100")
    run(s, [JobArrived(10.5, "b1", other)])
    out = run(s, [Tick(20)])
    assert holds(out) == [] and not any(isinstance(d, Place) for d in out)
    assert s.serving_gpus() == 2


def warm_gpus_of_an_over_served_team_on_three_nodes() -> Scheduler:
    """Three nodes of two GPUs; team-a (one GPU's share of six) used far more than
    team-b this week, and its drained workflows keep n1's GPUs and n2's first warm."""
    s = over_served_team(reserve_min=0, team_b_weight=5)
    run(s, [NodeJoined(0, gpu_node(f"n{i}", 2)) for i in (1, 2, 3)])
    run(s, [JobArrived(1, f"w{i}", flow()) for i in range(3)])
    ends = [TaskEnded(2 + i, f"w{i}", f"w{i}/{t}", "n1") for i in range(2) for t in "ab"]
    ends += [TaskEnded(4, "w2", "w2/a", "n2"), TaskEnded(4.1, "w2", "w2/b", "n2")]
    out = run(s, [*ends, Tick(10)])
    assert holds(out) == [] and s.serving_gpus() == 3  # kept warm: nothing presses on it yet
    return s


def test_under_budget_pressure_serving_makes_room_for_a_gang_on_the_node_it_lacks() -> None:
    s = warm_gpus_of_an_over_served_team_on_three_nodes()
    # Two whole nodes: n3 is free, and n2 lacks only the one GPU serving idles on.
    run(s, [JobArrived(10.5, "gang", job(4, allocation="team-b", min_runtime_s=7200))])
    out = run(s, [Tick(20)])
    assert holds(out) == [ServingReleased("n2", 0, "team-a")]  # the fewest given back
    placed = [(d.job_id, d.node_id) for d in out if isinstance(d, Place)]
    assert sorted(placed) == [("gang", "n2"), ("gang", "n3")]


def test_a_gang_takes_serving_gpus_only_as_far_as_the_share_counted_over_its_nodes() -> None:
    # All three nodes: n1's two idle GPUs and n2's one, three of team-a's, which
    # holds only two beyond its share. Taking any would place nothing.
    s = warm_gpus_of_an_over_served_team_on_three_nodes()
    run(s, [JobArrived(10.5, "gang", job(6, allocation="team-b", min_runtime_s=7200))])
    out = run(s, [Tick(20)])
    assert holds(out) == [] and not any(isinstance(d, Place) for d in out)
    assert s.serving_gpus() == 3


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 4),
    node_gpus=st.sampled_from([2, 4]),
    workflows=st.integers(1, 16),
    weight=st.integers(1, 9),
    reserve_min=st.integers(0, 2),
    asks=st.integers(1, 16),
    gpu_type=st.sampled_from(["", "H100", "A100"]),  # A100: no node has it
)
def test_budget_pressure_gives_serving_gpus_back_only_to_place_the_job_at_once(
    nodes: int,
    node_gpus: int,
    workflows: int,
    weight: int,
    reserve_min: int,
    asks: int,
    gpu_type: str,
) -> None:
    # Whatever the cluster, the idle serving GPUs and the job (one node's worth or a
    # gang): a GPU serving gives back is used by the job placed in the same pass (for a
    # gang, is on a node it was placed on: it needs them whole, and a gang of 5 on
    # 4-GPU nodes leaves 3 of its second node idle), and the team gives back no more
    # than it holds beyond its share, nor its warm GPUs.
    total = nodes * node_gpus
    workflows, asks = min(workflows, total), min(asks, total)
    s = over_served_team(reserve_min, team_b_weight=weight)
    run(s, [NodeJoined(0, gpu_node(f"n{i}", node_gpus)) for i in range(nodes)])
    arrived = run(s, [JobArrived(1, f"w{i}", flow()) for i in range(workflows)])
    where = {p.job_id: p.node_id for p in places(arrived)}
    for at, (job_id, node_id) in enumerate(sorted(where.items())):
        for task in "ab":  # b is sent where a ran (the plan keeps the chain together)
            run(s, [TaskEnded(2 + at + 0.1 * (task == "b"), job_id, f"{job_id}/{task}", node_id)])
    run(s, [Tick(19)])  # all drained and kept warm (lent only after 100 s, gone after 30)
    held = s.serving_gpus()
    batch = job(asks, allocation="team-b", min_runtime_s=7200, gpu_type=gpu_type)
    run(s, [JobArrived(19.5, "b1", batch)])
    out = run(s, [Tick(25)])  # the next preemption round
    given = [d for d in out if isinstance(d, ServingReleased)]
    used = {
        (d.node_id, i)
        for d in out
        if isinstance(d, Place) and d.job_id == "b1"
        for i in d.gpu_indices
    }
    if asks <= node_gpus:
        assert {(d.node_id, d.gpu_index) for d in given} <= used
    else:  # a gang takes whole free nodes (Capacity.fit), its last one maybe in part
        assert {d.node_id for d in given} <= {node_id for node_id, _ in used}
    beyond = held - total / (1 + weight)  # what team-a holds beyond its share (serving only)
    assert len(given) <= max(0, math.ceil(beyond - 1e-9))
    assert s.serving_gpus() >= min(held, reserve_min)


def test_an_idle_serving_gpu_is_charged_to_its_allocation_as_running_work_is() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, serving_lend_s=1000))
    run(s, [BudgetSet(0, tree(**{"team-a": 1, "team-b": 1})), NodeJoined(0, gpu_node("n1", 2))])
    batch = job(1, allocation="team-b", min_runtime_s=7200)
    run(s, [JobArrived(1, "w1", flow()), JobArrived(1, "b1", batch)])
    run(s, [TaskEnded(2, "w1", "w1/a", "n1"), TaskEnded(2.1, "w1", "w1/b", "n1"), Tick(30)])
    assert s.serving_gpus() == 1  # w1 is done; its GPU idles in the warm reserve
    explanation = s.explain("b1")
    assert explanation is not None and explanation.standing is not None
    # One GPU each since t=1: team-b has used half, what it is owed.
    assert explanation.standing.ratio == pytest.approx(1.0)


def test_gpus_a_batch_job_just_freed_are_no_warm_reserve_batch_work_would_take_them() -> None:
    # A full node: a batch job on GPU 0, the pool's one warm GPU idle on GPU 1, and a
    # 2-GPU batch job waiting. When the first ends, the GPU it frees goes to waiting
    # batch work in the same pass: counted as the reserve, it would let the pool lend
    # its own GPU too, and the waiting job would take both, leaving serving none.
    s = Scheduler(pool_config(serving_lend_s=0))
    run(s, [NodeJoined(0, gpu_node("n1", 2))])
    [first] = [d for d in s.handle(JobArrived(0.5, "b0", job(1))) if isinstance(d, Place)]
    assert places(s.handle(JobArrived(1, "w0", flow())))
    assert not [d for d in s.handle(JobArrived(1.2, "b1", job(2))) if isinstance(d, Place)]
    run(s, [TaskEnded(3, "w0", "w0/a", "n1"), TaskEnded(3, "w0", "w0/b", "n1")])
    assert s.serving_gpus() == 1
    out = s.handle(TaskEnded(10, "b0", first.task_id, "n1"))
    assert [d.job_id for d in out if isinstance(d, Place)] == []  # b1 still waits
    assert s.serving_gpus() == 1
    # Batch work left the GPU free: from the next pass on it counts as the reserve, and
    # then lending the warm GPU lets b1 fit after all (a known gap: holes and lent GPUs
    # together may fit a waiting job).
    run(s, [Tick(11)])
    assert s.serving_gpus() == 0


# -- a GPU refuses a task it would keep waiting past its limit ------------------------


def sent_root(s: Scheduler) -> Place:
    """w1 (a chain) on the first of two idle GPUs: its root sent there, with a limit."""
    [root] = places(run(s, [JobArrived(1, "w1", flow())]))
    return root


def test_compass_sends_each_task_with_the_wait_it_expects_plus_a_margin() -> None:
    s = two_gpus()
    [root] = places(run(s, [JobArrived(1, "w1", flow())]))
    assert root.serving is not None
    # Nothing is queued there as far as it knows: the limit is the margin alone.
    assert root.serving.wait_limit_ms == pytest.approx(0.2 * 500)
    heft = Scheduler(PolicyConfig(serving_mode="heft", serving_max_fraction=1.0))
    run(heft, [NodeJoined(0, gpu_node("n1"))])
    [fixed] = places(run(heft, [JobArrived(1, "w1", flow())]))
    assert fixed.serving is not None and fixed.serving.wait_limit_ms is None  # as planned


def refusal(place: Place, at: float = 1.01, wait_ms: float = 9000) -> TaskRefused:
    return TaskRefused(
        at, place.job_id, place.task_id, place.node_id, place.gpu_indices[0], wait_ms
    )


def test_a_refused_task_goes_to_another_gpu_with_why() -> None:
    s = two_gpus()
    root = sent_root(s)
    [again] = places(s.handle(refusal(root)))
    assert again.task_id == root.task_id and again.node_id != root.node_id
    assert again.serving is not None
    assert again.serving.planned == (root.node_id, 0)
    assert again.serving.reason == f"refused by {root.node_id}/0: 9000 ms of work queued there"
    # It runs there and the workflow goes on as if it had been sent there first.
    out = run(s, [TaskStarted(1.1, "w1", again.task_id, again.node_id)])
    out += run(s, [TaskEnded(1.6, "w1", again.task_id, again.node_id)])
    assert [p.task_id for p in places(out)] == ["w1/b"]


def test_a_task_refused_everywhere_is_sent_at_last_without_a_limit() -> None:
    s = Scheduler(PolicyConfig(serving_max_fraction=1.0, hold_threshold=0))
    run(s, [NodeJoined(0, gpu_node("n1"))])
    place = sent_root(s)
    for at in (1.01, 1.02, 1.03):
        [place] = places(s.handle(refusal(place, at)))
        assert place.node_id == "n1"  # the only GPU: back to it
    assert place.serving is not None and place.serving.wait_limit_ms is None
    # Sent without a limit, it cannot be refused: a refusal now is not believed.
    [refused] = s.handle(refusal(place, 1.04))
    assert isinstance(refused, Refused)


@pytest.mark.parametrize(
    "wrong",
    [
        {"gpu_index": 1},  # another GPU of its node
        {"node_id": "n9"},
        {"task_id": "w1/b"},  # planned, not sent
        {"task_id": "nope/a"},
    ],
    ids=["another GPU", "another node", "not sent", "unknown"],
)
def test_a_refusal_of_a_task_not_queued_on_that_gpu_is_refused_and_changes_nothing(
    wrong: dict[str, Any],
) -> None:
    s = two_gpus()
    root = sent_root(s)
    before = s.digest()
    [refused] = s.handle(dataclasses.replace(refusal(root), **wrong))
    assert isinstance(refused, Refused)
    assert s.digest() == before


def test_a_started_task_cannot_be_refused() -> None:
    s = two_gpus()
    root = sent_root(s)
    run(s, [TaskStarted(1.01, "w1", root.task_id, root.node_id)])
    [refused] = s.handle(refusal(root, 1.02))
    assert isinstance(refused, Refused)


def test_a_refused_task_of_a_cancelled_workflow_is_over_and_so_is_the_workflow() -> None:
    s = two_gpus()
    root = sent_root(s)
    out = run(s, [CancelRequested(1.01, "w1")])
    assert [type(d) for d in out] == [Cancel, Stop]
    assert s.handle(refusal(root, 1.02)) == []  # never to run: nothing sent again
    assert s.explain("w1") is None  # nothing left of it


def test_a_peers_refused_task_leaves_that_gpus_queue_here() -> None:
    s = two_gpus()
    run(s, [peer_task(1)])
    assert first_start_ms(s.handle(JobArrived(1, "w1", flow()))) < 3_000  # n2 is free
    peer = PeerTask("p1/x", "n1", 0, "llm", 5000, 10_000, 1000)
    assert s.handle(TaskRefused(1.1, "p1", peer.task_id, "n1", 0, 50_000)) == []
    # n1 is free of the peer's 10 s task: a new workflow may start there at once.
    [plan] = [d for d in s.handle(JobArrived(1.1, "w2", flow())) if isinstance(d, Planned)]
    assert {t.node_id for t in plan.tasks} == {"n1"}
    assert plan.tasks[0].start_ms < 3_000
