"""The Compass planner and its baselines on the published workflow profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from libs.core.compass import (
    Costs,
    GpuState,
    PlanMode,
    Planner,
    WorkflowError,
    evict_for,
    parse_workflow,
)

PROFILES = Path(__file__).resolve().parents[6] / "shared" / "data" / "compass" / "workflows.json"
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


def gpus(n: int, per_node: int = 1) -> list[GpuState]:
    return [GpuState(f"g{i}", f"n{i // per_node}", 0.0) for i in range(n)]


@pytest.mark.skipif(not PROFILES.exists(), reason="shared data not present")
def test_every_published_workflow_parses_in_topological_order() -> None:
    raw = json.loads(PROFILES.read_text())
    for name, spec in raw["workflows"].items():
        workflow = parse_workflow(name, spec["tasks"], raw["models"], COSTS)
        seen: set[str] = set()
        for task in workflow.tasks:
            assert set(task.parents) <= seen
            seen.add(task.task_id)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parents": ["ghost"]}, "translation/marian: unknown parent 'ghost'"),
        ({"run_ms": 0}, "translation/marian: run_ms must be > 0"),
        ({"model": "GPT5"}, "translation/marian: unknown model 'GPT5'"),
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


def test_adjust_moves_a_task_whose_gpu_is_backed_up() -> None:
    workflow = parse_workflow("translation", TRANSLATION, MODELS, COSTS)
    planner = Planner(COSTS)
    busy, idle = GpuState("busy", "n0", 5000.0), GpuState("idle", "n1", 0.0)
    marian = workflow.task("marian")
    assert planner.adjust(marian, busy, [busy, idle], ready_ms=1000).gpu_id == "idle"
    soon = GpuState("soon", "n0", 1100.0)
    assert planner.adjust(marian, soon, [soon, idle], ready_ms=1000).gpu_id == "soon"


def test_eviction_looks_ahead_and_spares_the_running_model() -> None:
    resident = {"a": 4000.0, "b": 4000.0, "c": 4000.0}
    next_use = {"a": 50.0, "b": 10.0}
    assert evict_for(3000, 14000, resident, next_use) == ("c",)  # never needed again
    assert evict_for(7000, 14000, resident, next_use) == ("c", "a")  # then the furthest
    assert evict_for(7000, 14000, resident, next_use, pinned=frozenset({"a"})) == ("c", "b")
    assert evict_for(20000, 14000, resident, next_use) is None
