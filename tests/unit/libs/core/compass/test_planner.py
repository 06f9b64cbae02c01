"""The Compass planner and its baselines on the published workflow profiles."""

from __future__ import annotations

from typing import Any

import pytest

from libs.core.compass import (
    Costs,
    GpuState,
    PlanMode,
    Planner,
    Task,
    Workflow,
    WorkflowError,
    build_workflow,
    evict_for,
)
from libs.core.compass.order import GpuOrder
from libs.core.compass.planner import Input
from libs.core.compass.timeline import Pending
from libs.sim.workflows import PROFILES, load_profiles

COSTS = Costs(host_to_gpu_mb_per_ms=10.171, node_to_node_mb_per_ms=12.583, gpu_memory_mb=14000)
MODELS = {"OPT": 5720, "marian": 800, "mt5": 2000, "NLI": 2140}
TRANSLATION: list[dict[str, Any]] = [
    {"id": "opt", "model": "OPT", "run_ms": 561, "in_kb": 1, "out_kb": 2, "parents": []},
    {"id": "marian", "model": "marian", "run_ms": 441, "in_kb": 2, "out_kb": 2, "parents": ["opt"]},
    {"id": "mt5_a", "model": "mt5", "run_ms": 778, "in_kb": 2, "out_kb": 2, "parents": ["opt"]},
    {"id": "mt5_b", "model": "mt5", "run_ms": 803, "in_kb": 2, "out_kb": 2, "parents": ["opt"]},
    {
        "id": "aggregate",
        "model": None,
        "run_ms": 1,
        "in_kb": 2,
        "out_kb": 2,
        "parents": ["marian", "mt5_a", "mt5_b"],
    },
]


def parse_workflow(
    name: str, tasks: list[dict[str, Any]], models: dict[str, float], costs: Costs
) -> Workflow:
    """A workflow as the Compass profiles spell it (sizes from ``models``)."""
    return build_workflow(
        name,
        [
            Task(
                t["id"],
                t["model"] or "",
                models[t["model"]] if t["model"] else 0.0,
                t["run_ms"],
                t["in_kb"],
                t["out_kb"],
                tuple(t["parents"]),
            )
            for t in tasks
        ],
        costs.gpu_memory_mb,
    )


def gpus(n: int, per_node: int = 1) -> list[GpuState]:
    return [GpuState(f"g{i}", f"n{i // per_node}", 0.0) for i in range(n)]


def adjust(
    planner: Planner,
    task: Task,
    planned: GpuState,
    others: list[GpuState],
    ready_ms: float,
    **kw: Any,
) -> str:
    """The GPU ``planner.adjust`` chooses among timelines built afresh as of ``ready_ms``."""
    own = planner.timeline(planned, ready_ms)
    lines = [planner.timeline(gpu, ready_ms) for gpu in others]
    return planner.adjust(task, own, lines, ready_ms, **kw).gpu_id


@pytest.mark.shared_data
def test_every_published_workflow_parses_in_topological_order() -> None:
    for workflow in load_profiles(PROFILES).workflows:
        seen: set[str] = set()
        for task in workflow.tasks:
            assert set(task.parents) <= seen
            seen.add(task.task_id)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parents": ["ghost"]}, "translation/marian: unknown parent 'ghost'"),
        ({"run_ms": 0}, "translation/marian: run_ms must be > 0"),
    ],
)
def test_invalid_workflows_are_refused_naming_the_task(
    change: dict[str, Any], message: str
) -> None:
    tasks = [dict(t) for t in TRANSLATION]
    tasks[1].update(change)
    with pytest.raises(WorkflowError, match=message):
        parse_workflow("translation", tasks, MODELS, COSTS)


def test_cycles_and_oversized_models_are_refused() -> None:
    tasks = [dict(t) for t in TRANSLATION]
    tasks[0]["parents"] = ["aggregate"]
    with pytest.raises(WorkflowError, match="part of a cycle"):
        parse_workflow("translation", tasks, MODELS, COSTS)
    with pytest.raises(WorkflowError, match="does not fit any GPU"):
        parse_workflow("translation", TRANSLATION, {**MODELS, "OPT": 20000}, COSTS)


def test_upward_rank_is_the_longest_path_to_the_exit() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    ranks = Planner(COSTS).upward_ranks(workflow)
    transfer = COSTS.transfer_ms(2, same_node=False)
    assert ranks["aggregate"] == 1
    assert ranks["opt"] == pytest.approx(561 + transfer + 803 + transfer + 1)


def test_compass_prefers_the_gpu_where_the_model_already_sits() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    cluster = gpus(4)
    cluster[2].resident["OPT"] = 5720
    plan = {a.task_id: a for a in Planner(COSTS).plan(workflow, cluster, now_ms=0)}
    assert plan["opt"].gpu_id == "g2" and plan["opt"].load_ms == 0
    # The two mt5 tasks run in parallel on different GPUs.
    assert plan["mt5_a"].gpu_id != plan["mt5_b"].gpu_id


def test_heft_is_blind_to_loads_and_hash_is_stable() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    cluster = gpus(4)
    cluster[2].resident["OPT"] = 5720
    heft = {a.task_id: a for a in Planner(COSTS, PlanMode.HEFT).plan(workflow, cluster, 0)}
    assert heft["opt"].gpu_id == "g0"  # first of equals: the cache does not count
    first = Planner(COSTS, PlanMode.HASH).plan(workflow, gpus(4), 0)
    again = Planner(COSTS, PlanMode.HASH).plan(workflow, gpus(4), 0)
    assert [a.gpu_id for a in first] == [a.gpu_id for a in again]


def test_planners_named_apart_take_idle_gpus_that_tie_in_orders_of_their_own() -> None:
    # Several planners read each other's sends late: in that moment each must not
    # take the same idle GPU. One unnamed planner takes the lowest id.
    qa = parse_workflow("qa", QA, MODELS, COSTS)
    firsts = {}
    for name in ("", "p0", "p1", "p2", "p3"):
        order = GpuOrder(name)
        plan = Planner(COSTS, order=order).plan(qa, gpus(16), now_ms=0)
        firsts[name] = plan[0].gpu_id
        assert firsts[name] == min((f"g{i}" for i in range(16)), key=order.key)
    assert firsts[""] == "g0"
    assert len({firsts[name] for name in ("p0", "p1", "p2", "p3")}) > 1
    # Its own order each time: a replay chooses as the planner did.
    assert Planner(COSTS, order=GpuOrder("p1")).plan(qa, gpus(16), 0)[0].gpu_id == firsts["p1"]


def test_adjust_sends_a_task_to_the_idle_gpu_first_in_the_planners_order() -> None:
    marian = parse_workflow("translation", TRANSLATION, MODELS, COSTS).task("marian")
    busy = GpuState("busy", "n0", 5000.0)
    idle = [GpuState(f"idle{i}", f"n{i + 1}", 0.0) for i in range(8)]
    for name in ("", "p0", "p1"):
        order = GpuOrder(name)
        chosen = adjust(Planner(COSTS, order=order), marian, busy, idle, ready_ms=1000)
        assert chosen == min((g.gpu_id for g in idle), key=order.key)


def test_adjust_moves_a_task_whose_gpu_is_backed_up() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    planner = Planner(COSTS)
    busy, idle = GpuState("busy", "n0", 5000.0), GpuState("idle", "n1", 0.0)
    marian = workflow.task("marian")
    assert adjust(planner, marian, busy, [idle], ready_ms=1000) == "idle"
    soon = GpuState("soon", "n0", 1100.0)
    assert adjust(planner, marian, soon, [idle], ready_ms=1000) == "soon"


def test_eviction_looks_ahead_and_spares_the_running_model() -> None:
    resident = {"a": 4000.0, "b": 4000.0, "c": 4000.0}
    next_use = {"a": 50.0, "b": 10.0}
    assert evict_for(3000, 14000, resident, next_use) == ("c",)  # never needed again
    assert evict_for(7000, 14000, resident, next_use) == ("c", "a")  # then the furthest
    assert evict_for(7000, 14000, resident, next_use, pinned=frozenset({"a"})) == ("c", "b")
    assert evict_for(20000, 14000, resident, next_use) is None


def test_eviction_can_go_least_recently_used_first_among_equals() -> None:
    resident = {"zeta": 4000.0, "alpha": 4000.0, "mid": 4000.0}  # least recently used first
    assert evict_for(3000, 14000, resident, {}) == ("alpha",)  # by name
    assert evict_for(3000, 14000, resident, {}, oldest_first=True) == ("zeta",)
    assert evict_for(3000, 14000, resident, {"zeta": 5.0}, oldest_first=True) == ("alpha",)


# -- the backlog: what was sent or planned on a GPU, played forward ----------------------

QA: list[dict[str, Any]] = [
    {"id": "opt", "model": "OPT", "run_ms": 560, "in_kb": 1, "out_kb": 2, "parents": []},
    {"id": "nli", "model": "NLI", "run_ms": 27, "in_kb": 1, "out_kb": 1, "parents": ["opt"]},
]


def test_a_task_planned_for_later_does_not_delay_one_ready_now() -> None:
    qa = parse_workflow("qa", QA, MODELS, COSTS)
    planner = Planner(COSTS)
    # g0 holds OPT; a successor is planned there for t=2000 (its parent still runs).
    later = GpuState(
        "g0", "n0", 0.0, {"OPT": 5720}, backlog=(Pending("marian", 800, 441, 2000, sent=False),)
    )
    plan = {a.task_id: a for a in planner.plan(qa, [later, *gpus(3)[1:]], now_ms=0)}
    assert plan["opt"].gpu_id == "g0" and plan["opt"].start_ms == 0  # fits before it
    # Sent work is served first come, first served: the same task, sent, is ahead.
    busy = GpuState("g0", "n0", 0.0, {"OPT": 5720}, backlog=(Pending("mt5", 2000, 803, 0),))
    plan = {a.task_id: a for a in planner.plan(qa, [busy, *gpus(3)[1:]], now_ms=0)}
    assert plan["opt"].gpu_id == "g1"  # loading OPT (562 ms) beats waiting 1000 ms
    assert plan["opt"].start_ms == pytest.approx(COSTS.load_ms(5720))


def test_a_model_a_queued_task_loads_counts_as_resident_after_it() -> None:
    qa = parse_workflow("qa", QA, MODELS, COSTS)
    queued = GpuState("g1", "n1", 0.0, backlog=(Pending("OPT", 5720, 100, 0),))
    plan = {a.task_id: a for a in Planner(COSTS).plan(qa, [queued], now_ms=0)}
    # OPT arrives with the queued task (562 ms load, 100 ms run); then it is a hit.
    assert plan["opt"].load_ms == 0
    assert plan["opt"].start_ms == pytest.approx(COSTS.load_ms(5720) + 100)
    # NLI must make room: 14000 MB holds OPT and NLI, so nothing is evicted.
    assert plan["nli"].load_ms == pytest.approx(COSTS.load_ms(2140))


def test_insertion_keeps_planned_successors_on_time_and_jit_plans_nothing() -> None:
    task = parse_workflow("qa", QA, MODELS, COSTS).task("nli")
    reserved = GpuState(
        "g0", "n0", 0.0, {"NLI": 2140}, backlog=(Pending("", 0, 500, 10, sent=False),)
    )
    idle = GpuState("g1", "n1", 0.0, {"NLI": 2140})
    planned = GpuState("g2", "n2", 5000.0, {"NLI": 2140})
    # compass moves the task off its backed-up GPU, but not into g0's 10 ms gap:
    # it would delay the task planned there.
    assert adjust(Planner(COSTS), task, planned, [reserved, idle], ready_ms=0) == "g1"
    # With g1 gone, g0 after its reservation (510 ms) beats waiting 5000 ms.
    assert adjust(Planner(COSTS), task, planned, [reserved], ready_ms=0) == "g0"
    # jit plans nothing, so the reservation is not one: g0 is free now, first of equals.
    jit = Planner(COSTS, PlanMode.JIT)
    assert adjust(jit, task, planned, [reserved, idle], 0, threshold=0) == "g0"
    assert Planner(COSTS).wait_ms(reserved, 0) == 0 and Planner(COSTS).wait_ms(planned, 0) == 5000


def test_adjust_counts_the_transfer_from_the_parents() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    aggregate = workflow.task("aggregate")
    planned = GpuState("far", "n9", 9000.0)
    near, other = GpuState("near", "n1", 0.0), GpuState("a", "n0", 0.0)
    inputs = [Input("n1", 100.0), Input("n1", 100.0)]
    chosen = adjust(Planner(COSTS), aggregate, planned, [other, near], 100.0, inputs=inputs)
    assert chosen == "near"  # no transfer there; "a" sorts first but needs one


def test_plans_are_deterministic_and_add_to_the_backlog() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    first, again = gpus(4), gpus(4)
    a = Planner(COSTS).plan(workflow, first, 0, job_id="j1")
    b = Planner(COSTS).plan(workflow, again, 0, job_id="j1")
    assert a == b and first == again
    assert sum(len(g.backlog) for g in first) == len(workflow.tasks)
    assert all(not p.sent for g in first for p in g.backlog)
    # A second job sees the first one's plan.
    second = {x.task_id: x for x in Planner(COSTS).plan(workflow, first, 0, job_id="j2")}
    assert second["opt"].start_ms > 0 or second["opt"].gpu_id not in {x.gpu_id for x in a}
