"""Batch jobs and workflows on one cluster, through the core scheduler: small runs."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from libs.core.model import WorkClass
from libs.sim.batch import FINISHED, LOST
from libs.sim.cluster import ClusterSpec
from libs.sim.mixed import (
    MixedCluster,
    Run,
    _Steps,
    mixed_policy,
    run_all,
    run_seeds,
    simulate_mixed,
)
from libs.sim.mixed_report import (
    COMPARISON,
    SEEDS_TITLE,
    markdown,
    not_working,
    seeds_markdown,
    seeds_table,
    tables,
)
from libs.sim.mixed_results import MixedRun
from libs.sim.mixed_workload import (
    SERVING_TEAM,
    MixedSettings,
    batch_jobs,
    workflow_arrivals,
)
from libs.sim.plots import write_mixed_plot
from libs.sim.tables import table
from libs.sim.workflows import PROFILES, Profiles, keyed, load_profiles, serving_policy

pytestmark = pytest.mark.shared_data

# Two 8-GPU nodes, six minutes of workflows after five of batch work alone.
SMALL = MixedSettings(
    cluster=ClusterSpec(2, 8, "H100", 80.0),
    hours=0.1,
    warmup_s=300.0,
    batch_runtime_s=(60.0, 600.0),
    workflow_rate_per_s=0.5,
    burst_s=(120.0, 240.0),
    tick_s=10.0,
    snapshot_s=60.0,
    sample_s=5.0,
)
TINY = dataclasses.replace(SMALL, hours=0.02, burst_s=(20.0, 40.0))  # a minute of workflows


@pytest.fixture(scope="module")
def profiles() -> Profiles:
    return load_profiles(PROFILES)


@pytest.fixture(scope="module")
def sim(profiles: Profiles) -> tuple[MixedCluster, MixedRun]:
    simulation = MixedCluster(profiles, serving_policy(profiles.costs), SMALL)
    return simulation, simulation.simulate()


@pytest.fixture(scope="module")
def capped(profiles: Profiles) -> MixedRun:
    # A serving team owed most of the cluster: it is never reduced under budget pressure,
    # so only the cap bounds it.
    owed = dataclasses.replace(
        SMALL, teams=(("vision", 20.0), ("language", 20.0), (SERVING_TEAM, 60.0))
    )
    return simulate_mixed(profiles, serving_policy(profiles.costs, serving_max_fraction=0.25), owed)


def test_serving_never_holds_more_than_its_cap(capped: MixedRun) -> None:
    assert capped.serving_cap == 4
    assert capped.at_cap_pct > 0  # the cap did bind
    assert capped.peak_serving_held <= 4  # at every input, as the core holds them
    assert capped.peak_serving_active <= 4  # GPUs the workers saw serving work on
    assert max(s.serving_held for s in capped.series) <= 4


def test_every_workflow_finishes_no_faster_than_its_best_case(
    sim: tuple[MixedCluster, MixedRun],
) -> None:
    simulation, run = sim
    assert run.workflow_jobs == len(simulation.arrivals) > 200
    assert run.workflows["all"].count == run.workflow_jobs
    assert run.workflows["calm"].count + run.workflows["burst"].count == run.workflow_jobs
    assert run.workflows["burst"].count > run.workflows["calm"].count  # 4× for half as long
    assert run.workflows["all"].median >= 1.0 - 1e-9
    assert run.cache_hit_rate > 0.5


def test_batch_work_still_gets_gpus(sim: tuple[MixedCluster, MixedRun]) -> None:
    simulation, run = sim
    for phase in ("calm", "burst"):
        held = run.batch_held[phase].mean + run.serving_held[phase].mean
        assert run.batch_held[phase].mean > 0.5 * run.capacity
        assert held <= run.capacity
    assert run.batch_waits[("all", "all")].count == run.jobs > 0
    assert all(j.first_start is not None for j in simulation.jobs.values())
    # Serving GPUs went back to batch work, taking their cached models with them.
    assert run.batch_evictions > 0


def test_the_gpus_not_doing_work_are_accounted_for_by_why(
    sim: tuple[MixedCluster, MixedRun],
) -> None:
    _, run = sim
    for phase in ("calm", "burst", "all"):
        parts = (
            run.serving_held[phase].mean - run.serving_busy[phase],
            run.free_kept[phase].mean,
            run.free_other[phase].mean,
        )
        assert all(part >= 0 for part in parts)
        # Every GPU is held by batch work, running a workflow task, or one of the parts.
        doing = run.batch_held[phase].mean + run.serving_busy[phase]
        assert not_working(run, phase) == pytest.approx(run.capacity - doing)
        assert sum(parts) == pytest.approx(not_working(run, phase))
    assert run.serving_held["all"].mean > run.serving_busy["all"]  # a warm reserve idles
    rows = tables(run)["GPUs not doing work, by why (mean GPUs)"][1]
    assert [row[0] for row in rows] == ["all", "calm", "burst"]


def test_the_pool_s_stalls_lie_within_the_window(sim: tuple[MixedCluster, MixedRun]) -> None:
    _, run = sim
    assert 0 <= run.longest_stall_s <= run.stalled_s <= run.window_s


def test_the_longest_spell_is_unbroken_and_cut_at_the_window() -> None:
    steps = _Steps()  # 0 from time 0
    for at, value in ((10, 1), (20, 0), (25, 1), (40, 1), (60, 0), (70, 1)):
        steps.set(at, value)
    assert steps.longest(1, (0, 100)) == 35  # 25-60: setting 1 again at 40 breaks nothing
    assert steps.longest(1, (0, 50)) == 25  # cut at the window's end
    assert steps.longest(1, (65, 100)) == 30  # the last spell runs on past its last change
    assert steps.longest(0, (0, 100)) == 10  # 0-10 and 60-70, not 20-25
    assert steps.longest(2, (0, 100)) == 0


def test_batch_jobs_alone_are_the_same_jobs_with_no_workflows(
    profiles: Profiles, sim: tuple[MixedCluster, MixedRun]
) -> None:
    simulation, run = sim
    baseline = MixedCluster(profiles, serving_policy(profiles.costs), SMALL, workflows=False)
    alone = baseline.simulate()
    assert [j.sim for j in baseline.jobs.values()] == [j.sim for j in simulation.jobs.values()]
    assert alone.workflow_jobs == 0 and alone.serving_held["all"].mean == 0
    assert alone.jobs == run.jobs
    doing = alone.busy_occupancy_pct * alone.capacity / 100
    assert not_working(alone, "all") == pytest.approx(alone.capacity - doing)
    text = markdown([run], SMALL, alone)
    assert "batch jobs alone: not doing work" in text
    assert f"busy, batch jobs alone (no workflows) | {alone.busy_occupancy_pct:.1f}%" in text


def test_charges_per_allocation_add_up_to_the_gpu_time_run(
    sim: tuple[MixedCluster, MixedRun],
) -> None:
    simulation, run = sim
    assert run.gpu_s_charged.keys() == run.gpu_s_run.keys()
    # Batch tasks are charged as they ran; serving's GPUs for as long as it held them.
    held = {SERVING_TEAM: run.gpu_s_held}
    for name, used in run.gpu_s_run.items():
        assert run.gpu_s_charged[name] == pytest.approx(used + held.get(name, 0.0))
    needed: dict[str, float] = {}
    for job in simulation.jobs.values():
        spec = job.sim.spec
        if job.state != FINISHED:  # preempted (borrowed or free work) and cannot resume
            assert (job.state, spec.resumable) == (LOST, False)
            continue
        needed[spec.allocation] = needed.get(spec.allocation, 0.0) + spec.gpus * job.sim.runtime_s
    for name, work in needed.items():
        assert run.gpu_s_run[name] >= work - 1e-6  # preempted work that resumes runs again
    workflows = sum(t.run_ms for _, flow in simulation.arrivals for t in flow.tasks) / 1000
    assert run.gpu_s_held >= workflows  # every workflow task ran on a GPU serving held
    serving = next(c for c in run.charges if c.allocation == SERVING_TEAM)
    assert 0 < serving.serving_gpu_h <= serving.serving_held_gpu_h <= serving.allocated_gpu_h
    in_window = sum(c.allocated_gpu_h + c.free_gpu_h for c in run.charges)
    assert in_window <= run.capacity * run.window_s / 3600 + 1e-6
    assert sum(c.entitlement for c in run.charges) == pytest.approx(1.0)


def test_the_same_seed_gives_the_same_metrics(
    profiles: Profiles, sim: tuple[MixedCluster, MixedRun]
) -> None:
    _, run = sim
    assert simulate_mixed(profiles, serving_policy(profiles.costs), SMALL) == run
    other = simulate_mixed(
        profiles, serving_policy(profiles.costs), dataclasses.replace(SMALL, seed=8)
    )
    assert other != run


def test_workflows_arrive_faster_during_the_burst(profiles: Profiles) -> None:
    settings = MixedSettings(hours=1000 / 3600, workflow_rate_per_s=5.0, burst_s=(200.0, 400.0))
    flows = [keyed(w) for w in profiles.workflows]
    times = [at for at, _ in workflow_arrivals(settings, flows, random.Random(1))]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 1000
    burst = sum(1 for t in times if 200 <= t < 400) / 200
    calm = sum(1 for t in times if not 200 <= t < 400) / 800
    assert burst / calm == pytest.approx(4.0, rel=0.15)


def test_batch_jobs_offer_the_load_asked_for() -> None:
    settings = MixedSettings(hours=20.0, warmup_s=0.0)
    jobs = batch_jobs(settings, random.Random(3))
    offered = sum(j.spec.gpus * j.runtime_s for j in jobs) / (128 * settings.end_s)
    assert offered == pytest.approx(2.0, rel=0.1)
    assert {j.spec.work_class for j in jobs} == set(WorkClass)
    assert {j.spec.gpus for j in jobs} == {1, 2, 4, 8}
    share = sum(1 for j in jobs if j.spec.allocation == SERVING_TEAM) / len(jobs)
    assert share == pytest.approx(0.1, abs=0.03)


def test_the_report_and_the_plot(
    tmp_path: Path, sim: tuple[MixedCluster, MixedRun], capped: MixedRun
) -> None:
    _, run = sim
    text = markdown([run, capped], SMALL)
    assert "## GPUs held over time (serving cap 8 of 16" in text
    assert "## serving_max_fraction side by side" in text
    _, rows = table(COMPARISON, [run, capped])
    assert [r[:2] for r in rows] == [["0.5", "8"], ["0.25", "4"]]
    path = write_mixed_plot([run, capped], tmp_path / "mixed.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_runs_in_processes_match_runs_in_turn(profiles: Profiles) -> None:
    runs = [Run(mixed_policy(profiles, f), TINY) for f in (0.5, 0.25)]
    told: list[MixedRun] = []
    alone = run_all(profiles, runs, on_run=told.append)
    assert told == alone  # each run as it ended
    told.clear()
    assert run_all(profiles, runs, parallel=True, on_run=told.append) == alone
    assert sorted(told, key=lambda r: r.serving_max_fraction) == sorted(
        alone, key=lambda r: r.serving_max_fraction
    )
    assert [r.serving_max_fraction for r in alone] == [0.5, 0.25]


def test_each_seed_runs_every_fraction_and_its_batch_jobs_alone(profiles: Profiles) -> None:
    results = run_seeds(profiles, [0.5, 0.25], TINY, [3, 1], parallel=True)
    assert [r.seed for r in results] == [3, 1]
    for result in results:
        seeded = dataclasses.replace(TINY, seed=result.seed)
        policies = [mixed_policy(profiles, f) for f in (0.5, 0.25)]
        assert list(result.runs) == [simulate_mixed(profiles, p, seeded) for p in policies]
        assert result.alone == simulate_mixed(profiles, policies[0], seeded, workflows=False)
    assert results[0].runs[0] != results[1].runs[0]  # the seeds' workloads differ


def test_the_table_over_the_seeds_puts_the_worst_seed_beside_the_mean(
    profiles: Profiles,
) -> None:
    results = run_seeds(profiles, [0.5], TINY, [1, 2, 3])
    header, rows = seeds_table(results)
    assert [row[0] for row in rows] == ["1", "2", "3", "mean", "worst"]
    column = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    doing = [r.runs[0].busy_occupancy_pct for r in results]
    assert column["GPUs doing work"] == [
        *(f"{v:.2f}%" for v in doing),
        f"{sum(doing) / 3:.2f}%",
        f"{min(doing):.2f}%",  # the worst is the least doing work...
    ]
    p99 = [r.runs[0].workflows["burst"].p99 for r in results]
    assert column["wf p99 burst"][-1] == f"{max(p99):.2f}"  # ...and the largest tail
    assert column["batch jobs alone"][0] == f"{results[0].alone.busy_occupancy_pct:.2f}%"
    text = seeds_markdown(results, TINY)
    assert text.startswith(f"# {SEEDS_TITLE}") and "| worst | 0.5 |" in text


def qm_sim_mixed(out: Path, *flags: str) -> Result:
    """``qm sim mixed`` on two nodes for a minute of workflows, writing to ``out``."""
    from cli.sim import sim_app

    result = CliRunner().invoke(
        sim_app,
        [
            "mixed",
            "--hours", "0.02", "--nodes", "2", "--warmup", "60s",
            "--burst-start", "20s", "--burst-end", "40s", "--rate", "0.5",
            "--no-parallel", "--profiles", str(PROFILES), "--out", str(out), *flags,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result


def test_qm_sim_mixed_prints_the_tables_and_writes_the_report(tmp_path: Path) -> None:
    result = qm_sim_mixed(tmp_path, "--compare", "0.25")
    assert "side by side" in result.output and "2 runs in" in result.output
    assert "busy, batch jobs alone (no workflows)" in result.output
    assert (tmp_path / "summary.md").read_text().startswith("# Mixed cluster")
    assert (tmp_path / "mixed.png").exists()


def test_qm_sim_mixed_over_seeds_shows_each_seed_the_mean_and_the_worst(tmp_path: Path) -> None:
    result = qm_sim_mixed(tmp_path, "--compare", "", "--seeds", "2,1", "-o", "json")
    shown = json.loads(result.stdout)
    assert shown["seeds"] == [2, 1] and shown["fractions"] == [0.5]
    [over] = shown["tables"]
    assert over["title"] == SEEDS_TITLE
    assert [row["seed"] for row in over["rows"]] == ["2", "1", "mean", "worst"]
    assert (tmp_path / "seeds.md").read_text().startswith(f"# {SEEDS_TITLE}")
