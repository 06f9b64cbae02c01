"""The workflow-serving simulation on the published Compass profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.core.compass import Costs, PlanMode, parse_workflow
from libs.sim.workflows import simulate

PROFILES = Path(__file__).resolve().parents[5] / "shared" / "data" / "compass" / "workflows.json"

pytestmark = pytest.mark.skipif(not PROFILES.exists(), reason="shared data not present")


def _setup() -> tuple[list, dict[str, float], Costs]:  # type: ignore[type-arg]
    raw = json.loads(PROFILES.read_text())
    c = raw["cluster"]
    costs = Costs(c["host_to_gpu_mb_per_ms"], c["node_to_node_mb_per_ms"], c["gpu_memory_mb"])
    flows = [
        parse_workflow(n, w["tasks"], raw["models"], costs) for n, w in raw["workflows"].items()
    ]
    best = {n: w["best_case_ms"] for n, w in raw["workflows"].items()}
    return flows, best, costs


def test_a_run_is_deterministic_and_every_job_finishes() -> None:
    flows, best, costs = _setup()
    first = simulate(flows, best, costs, mode=PlanMode.COMPASS, gpus=32, jobs=200)
    again = simulate(flows, best, costs, mode=PlanMode.COMPASS, gpus=32, jobs=200)
    assert first == again
    assert first.jobs == 180  # 10% warm-up dropped
    assert set(first.per_workflow) == {f.name for f in flows}


def test_compass_needs_fewer_gpus_than_hash_for_the_same_slowdown() -> None:
    flows, best, costs = _setup()
    compass = simulate(flows, best, costs, mode=PlanMode.COMPASS, gpus=64, jobs=400)
    hash_half = simulate(flows, best, costs, mode=PlanMode.HASH, gpus=64, jobs=400)
    hash_full = simulate(flows, best, costs, mode=PlanMode.HASH, gpus=128, jobs=400)
    assert compass.median_slowdown < hash_half.median_slowdown
    assert compass.median_slowdown <= hash_full.median_slowdown * 1.25
    assert compass.cache_hit_rate > hash_half.cache_hit_rate
