"""The workflow-serving simulation on the published Compass profiles, through the core."""

from __future__ import annotations

import dataclasses
import itertools
import queue
import random
import statistics
from collections.abc import Iterable
from typing import Any

import pytest

from libs.core.compass import CacheModel, PlanMode, Workflow
from libs.core.decisions import Place, Planned, ServingHeld, ServingReleased
from libs.core.inputs import Input, JobArrived, PeerArrived, PeerPlanned
from libs.core.model import JobSpec
from libs.core.scheduler import Scheduler
from libs.sim.workflows import (
    ARRIVALS,
    PROFILES,
    Case,
    Profiles,
    ServingCluster,
    SweepRun,
    WorkflowRun,
    claims,
    hits,
    keyed,
    load_profiles,
    markdown,
    over_seeds,
    policy,
    serving_cluster,
    simulate,
    sweep,
    sweep_runner,
    tables,
)
from libs.sim.workflows.serving_cluster import arrivals

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def profiles() -> Profiles:
    return load_profiles(PROFILES)


def run(
    profiles: Profiles, mode: PlanMode, gpus: int, jobs: int = 200, **knobs: Any
) -> WorkflowRun:
    return simulate(profiles, mode=mode, gpus=gpus, jobs=jobs, **knobs)


def test_a_run_is_deterministic_and_every_job_finishes(profiles: Profiles) -> None:
    first = run(profiles, PlanMode.COMPASS, 32)
    again = run(profiles, PlanMode.COMPASS, 32)
    assert first == again
    assert first.jobs == 180  # 10% warm-up dropped
    assert set(first.per_workflow) == {f.name for f in profiles.workflows}
    assert first.decisions > 0 and 0 < first.cache_hit_rate < 1
    assert 0 < first.gpus_used <= 32
    # The breakdown: every task ran its own run time, and waits are never negative.
    assert first.breakdown_ms["run"] > 0
    assert all(v >= 0 for parts in first.task_breakdown_ms.values() for v in parts.values())
    translation = first.task_breakdown_ms[("translation", "mt5_b")]
    assert translation["run"] == 803


def test_under_overload_compass_holds_workflows_back_and_the_run_says_how_long(
    profiles: Profiles,
) -> None:
    compass, jit = (run(profiles, mode, 4) for mode in (PlanMode.COMPASS, PlanMode.JIT))
    assert compass.held_ms > 0  # 4 GPUs for 40 workflows a second: queues are deep
    assert jit.held_ms == 0  # the baselines plan every workflow on arrival
    # Held time is part of the latency (a mean: workflows due late are held longest).
    assert compass.p99_latency_ms > compass.held_ms


def test_bursty_arrivals_keep_the_mean_rate() -> None:
    poisson = arrivals(4000, 40.0, 0.0, random.Random(1))
    bursty = arrivals(4000, 40.0, ARRIVALS["gamma"], random.Random(1))
    for times in (poisson, bursty):
        assert times[-1] / len(times) == pytest.approx(25.0, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(bursty)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(2.0, rel=0.15)


def test_models_are_cached_per_workflow_as_the_source_does(profiles: Profiles) -> None:
    qa = next(f for f in profiles.workflows if f.name == "question_answer")
    assert keyed(qa).task("opt").model == "question_answer/OPT"
    shared = run(profiles, PlanMode.COMPASS, 32, share_models=True)
    assert shared.cache_hit_rate >= run(profiles, PlanMode.COMPASS, 32).cache_hit_rate - 0.05


def test_the_core_plans_each_workflow_and_the_workers_report_back(profiles: Profiles) -> None:
    seen: list[object] = []
    cluster = ServingCluster(
        [Scheduler(policy(PlanMode.COMPASS, profiles.costs))],
        profiles.costs,
        on_decision=seen.append,
    )
    for i in range(2):
        cluster.add_gpu_node(f"n{i}", (0,), profiles.costs.gpu_memory_mb)
    world = cluster.world
    assert world.workers[("n0", 0)].capacity_mb == pytest.approx(14000)
    flow = keyed(profiles.workflows[0])
    cluster.feed(JobArrived(0.0, "w1", JobSpec("serving", "sim", 1, (), workflow=flow)))
    cluster.run()
    kinds = [type(d) for d in seen]
    # One plan; the GPUs it used are held for the workflow's allocation (and charged).
    assert kinds.count(Planned) == 1 and ServingHeld in kinds
    assert set(kinds) <= {Planned, ServingHeld, ServingReleased}
    assert len(world.ended) == len(flow.tasks) and "w1" in world.done
    # Four tasks with a model on two cold GPUs: OPT, marian and mt5 load at least once.
    counts = hits(world.served)
    assert sum(h + m for h, m in counts.values()) == 4
    assert sum(m for _, m in counts.values()) >= 3


def test_compass_needs_fewer_gpus_than_hash_for_the_same_slowdown(profiles: Profiles) -> None:
    compass = run(profiles, PlanMode.COMPASS, 64, jobs=400)
    hash_half = run(profiles, PlanMode.HASH, 64, jobs=400)
    hash_full = run(profiles, PlanMode.HASH, 128, jobs=400)
    assert compass.median_slowdown < hash_half.median_slowdown
    assert compass.median_slowdown <= hash_full.median_slowdown
    assert compass.cache_hit_rate > hash_half.cache_hit_rate


def test_the_sweep_reports_its_tables_and_claims(profiles: Profiles) -> None:
    runs = sweep(profiles, [16, 32], [PlanMode.COMPASS, PlanMode.HASH], {"poisson": 0.0}, jobs=60)
    assert [(r.arrivals, r.run.gpus, r.run.mode) for r in runs] == [
        ("poisson", 16, PlanMode.COMPASS),
        ("poisson", 16, PlanMode.HASH),
        ("poisson", 32, PlanMode.COMPASS),
        ("poisson", 32, PlanMode.HASH),
    ]
    text = markdown(runs, 1.0)
    assert "## Poisson arrivals, lookahead caches, reports 0 ms late: slowdown" in text
    assert "per workflow" in text and "per task" in text
    # What qm sim workflows prints is the same tables, the tasks' aside.
    printed = tables(runs, per_task=False)
    assert [title for title, _, _ in printed] == [
        title for title, _, _ in tables(runs) if not title.endswith("per task, mean ms")
    ]
    for title, header, rows in printed:
        assert f"## {title}" in text and "| " + " | ".join(header) + " |" in text
        assert all("| " + " | ".join(row) + " |" in text for row in rows)
    assert "Sweep runtime: 1.0 s for 4 runs." in text
    (claim,) = claims(runs)
    assert claim.text.startswith("poisson: hash reaches median")


def test_a_sweep_over_processes_gives_the_serial_runs(profiles: Profiles) -> None:
    cases = (profiles, [16, 24], [PlanMode.COMPASS, PlanMode.HASH], {"poisson": 0.0, "gamma": 0.25})
    serial = sweep(*cases, jobs=60)
    ended: list[SweepRun] = []
    parallel = sweep(*cases, jobs=60, workers=2, on_run=ended.append)
    assert [r.run for r in parallel] == [r.run for r in serial]
    assert sorted(map(id, ended)) == sorted(map(id, parallel))


def test_each_run_tells_its_progress_in_this_process_or_from_a_worker(
    profiles: Profiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving_cluster, "PROGRESS_EVERY", 100)
    heard: list[tuple[str, float]] = []
    sweep(
        profiles,
        [16],
        [PlanMode.HASH],
        {"poisson": 0.0},
        jobs=60,
        on_progress=lambda *u: heard.append(u),
    )
    assert heard and {run for run, _ in heard} == {"poisson 16 GPUs hash seed 7"}
    shares = [share for _, share in heard]
    # Shares of the run's jobs: they grow, and a run near its end is near 1.
    assert shares == sorted(shares) and shares[0] >= 0 and 0.5 <= shares[-1] <= 1
    # A worker process sends the same to its parent.
    sent: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
    monkeypatch.setattr(sweep_runner, "_updates", sent)
    sweep_runner._sweep_run(profiles, Case("poisson", 0.0, 16, PlanMode.HASH, 7), {"jobs": 60})
    relayed = [sent.get() for _ in range(sent.qsize())]
    assert relayed == heard


def test_stale_reports_reach_the_planner_late_and_cost_each_hop(profiles: Profiles) -> None:
    fresh = run(profiles, PlanMode.COMPASS, 64, jobs=60)
    stale = run(profiles, PlanMode.COMPASS, 64, jobs=60, staleness_ms=50.0)
    assert (fresh.staleness_ms, stale.staleness_ms) == (0.0, 50.0)
    # A lightly loaded cluster: each task's end reaches the planner 50 ms late, and its
    # successors are sent then; every workflow has at least one task after another.
    assert stale.median_latency_ms >= fresh.median_latency_ms + 50.0
    assert run(profiles, PlanMode.COMPASS, 64, jobs=60, staleness_ms=50.0) == stale


def two_planners_place(
    profiles: Profiles, staleness_ms: float, names: tuple[str, str] = ("", "")
) -> list[tuple[str, str]]:
    """Two planners, two GPUs, two translations arriving 5 ms apart: where each root went."""
    sent: list[tuple[str, str]] = []
    config = policy(PlanMode.COMPASS, profiles.costs)
    cluster = ServingCluster(
        [Scheduler(dataclasses.replace(config, serving_planner=name)) for name in names],
        profiles.costs,
        staleness_ms=staleness_ms,
    )
    send = cluster.world.send

    def record(place: Place) -> None:
        sent.append((place.job_id, place.node_id))
        send(place)

    cluster.world.send = record  # type: ignore[method-assign]
    for i in range(2):
        cluster.add_gpu_node(f"n{i}", (0,), profiles.costs.gpu_memory_mb)
    translation = keyed(next(f for f in profiles.workflows if f.name == "translation"))
    for n in range(2):
        spec = JobSpec("serving", "sim", 1, (), workflow=translation)
        cluster.world.at(5.0 * n, JobArrived(0.005 * n, f"w{n}", spec))
    cluster.run()
    assert cluster.planned_by == [1, 1]  # the arrivals, in turn
    return sent[:2]  # the roots: the rest are sent half a second later


def test_planners_share_their_placements_off_the_log_late(profiles: Profiles) -> None:
    # On time, the second planner sees the first one's root queued on n0 and goes to n1.
    [(_, first), (_, second)] = two_planners_place(profiles, staleness_ms=0.0)
    assert first != second
    # 10 ms late, it has not heard of it yet when its workflow arrives: both pick n0.
    [(_, first), (_, second)] = two_planners_place(profiles, staleness_ms=10.0)
    assert first == second
    # Named as the simulation names them, each takes idle GPUs in its own order: p0
    # n0 first, p1 n1 first (order.py), and they keep apart without hearing.
    [(_, first), (_, second)] = two_planners_place(profiles, 10.0, names=("p0", "p1"))
    assert (first, second) == ("n0", "n1")


def three_planners_hear(profiles: Profiles) -> tuple[Workflow, list[tuple[int, Input, float]]]:
    """Three planners, one workflow handed to the first: what each heard, and when."""
    heard: list[tuple[int, Input, float]] = []
    cluster = ServingCluster(
        [Scheduler(policy(PlanMode.COMPASS, profiles.costs)) for _ in range(3)],
        profiles.costs,
        staleness_ms=10.0,
    )
    decide = cluster._decide

    def record(event: Input, indices: Iterable[int]) -> None:
        indices = list(indices)
        heard.extend((i, event, cluster.world.now) for i in indices)
        decide(event, indices)

    cluster._decide = record  # type: ignore[method-assign]
    cluster.add_gpu_node("n0", (0,), profiles.costs.gpu_memory_mb)
    flow = keyed(profiles.workflows[0])
    cluster.world.at(0.0, JobArrived(0.0, "w0", JobSpec("serving", "sim", 1, (), workflow=flow)))
    cluster.run()
    return flow, heard


def test_each_planner_reads_the_others_arrivals_late(profiles: Profiles) -> None:
    flow, heard = three_planners_hear(profiles)
    arrivals = [(i, e, at) for i, e, at in heard if isinstance(e, JobArrived | PeerArrived)]
    assert [(i, type(e).__name__, at) for i, e, at in arrivals] == [
        (0, "JobArrived", 0.0),
        (1, "PeerArrived", 10.0),
        (2, "PeerArrived", 10.0),
    ]
    peer = arrivals[1][1]
    assert isinstance(peer, PeerArrived) and (peer.job_id, peer.work_ms) == ("w0", flow.work_ms)


def test_each_planner_reads_the_others_plans_late(profiles: Profiles) -> None:
    flow, heard = three_planners_hear(profiles)
    plans = [(i, e, at) for i, e, at in heard if isinstance(e, PeerPlanned)]
    assert [(i, at) for i, _, at in plans] == [(1, 10.0), (2, 10.0)]
    plan = plans[0][1]
    assert isinstance(plan, PeerPlanned) and plan.job_id == "w0"
    # Every task, on the one GPU, with what it takes there from the workflow.
    assert [(t.task_id, t.node_id, t.gpu_index) for t in plan.tasks] == [
        (f"w0/{task.task_id}", "n0", 0) for task in flow.tasks
    ]
    assert [(t.model, t.run_ms) for t in plan.tasks] == [(t.model, t.run_ms) for t in flow.tasks]
    # The first task is expected at once (its model's load is the plan's too).
    assert plan.tasks[0].ready_ms == 0.0


def test_several_planners_finish_every_workflow_deterministically(profiles: Profiles) -> None:
    four = run(profiles, PlanMode.COMPASS, 32, jobs=100, planners=4, staleness_ms=10.0)
    assert four.planners == 4 and four.jobs == 90
    assert run(profiles, PlanMode.COMPASS, 32, jobs=100, planners=4, staleness_ms=10.0) == four
    # GPUs refused sends the planners did not know to be backed up; each went elsewhere.
    assert 0 < four.refused <= four.adjusted


@pytest.mark.parametrize("mode", list(PlanMode))
def test_every_mode_runs_with_several_planners_and_only_compass_is_refused(
    profiles: Profiles, mode: PlanMode
) -> None:
    # heft's plan leaves the loads out of its starts: its peers still read no negative time.
    four = run(profiles, mode, 16, jobs=60, planners=4, staleness_ms=10.0)
    assert four.jobs == 54
    assert (four.refused > 0) == (mode is PlanMode.COMPASS)


def test_fifo_cost_caches_charge_evictions_the_lookahead_ones_do_not(profiles: Profiles) -> None:
    free = run(profiles, PlanMode.HASH, 16, jobs=100)
    costly = run(profiles, PlanMode.HASH, 16, jobs=100, cache_model=CacheModel.FIFO_COST)
    assert (free.cache_model, costly.cache_model) == (CacheModel.LOOKAHEAD, CacheModel.FIFO_COST)
    # The same placements (hash), but FIFO evicts what is needed next and pays to.
    assert costly.breakdown_ms["load"] > free.breakdown_ms["load"]
    assert costly.cache_hit_rate < free.cache_hit_rate


def test_a_sweep_over_seeds_reports_each_seed_and_each_settings_spread(
    profiles: Profiles,
) -> None:
    runs = sweep(
        profiles, [16], [PlanMode.COMPASS, PlanMode.HASH], {"poisson": 0.0}, jobs=40, seeds=(3, 4)
    )
    assert [(r.run.mode, r.seed) for r in runs] == [
        (PlanMode.COMPASS, 3), (PlanMode.COMPASS, 4), (PlanMode.HASH, 3), (PlanMode.HASH, 4),
    ]  # fmt: skip
    assert runs[0].run != runs[1].run  # another seed, another workload
    text = markdown(runs, 1.0)
    assert "slowdown over the seeds 3, 4" in text and "## Claims (medians over the seeds)" in text
    [compass, _] = over_seeds(runs)
    assert compass.run.median_slowdown == statistics.median(r.run.median_slowdown for r in runs[:2])


def test_claims_compare_compass_with_each_rival_at_every_size(profiles: Profiles) -> None:
    base = run(profiles, PlanMode.COMPASS, 16, jobs=20)

    def fake(mode: PlanMode, gpus: int, median: float) -> SweepRun:
        from dataclasses import replace

        return SweepRun("poisson", replace(base, mode=mode, gpus=gpus, median_slowdown=median), 0)

    runs = [
        fake(PlanMode.COMPASS, 32, 3.0),
        fake(PlanMode.COMPASS, 64, 1.1),
        fake(PlanMode.HASH, 32, 9.0),
        fake(PlanMode.HASH, 64, 2.0),
        fake(PlanMode.JIT, 32, 2.0),
        fake(PlanMode.JIT, 64, 1.5),
    ]
    found = {c.text: c.holds for c in claims(runs)}
    assert found == {
        "poisson: hash reaches median 2.00 with 64 GPUs; compass with 64 (100%)": False,
        "poisson: compass's median below jit's at all but 32 GPUs": False,
    }
