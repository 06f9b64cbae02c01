"""Scenario to report, end to end on a tiny Philly-format trace, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.params import Duration
from cli.sim import sim_app
from libs.core import PolicyConfig
from libs.sim import build_workload
from libs.sim.recorder import Unstarted
from libs.sim.report import SUMMARY, _behind, duration
from libs.sim.scenario import Targets
from libs.sim.scenario_file import load_scenario
from libs.sim.tables import table

REPO = Path(__file__).resolve().parents[4]
HEADER = "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\r\n"


def tiny_scenario(tmp_path: Path) -> Path:
    sizes = (0, 1, 2, 4, 8)  # 0: a CPU-only row, as real traces have
    rows = [
        f"{i},{1 + i % 6},{sizes[i % 5]},0,1,{i * 37 % 120},{60 + i * 53 % 4000},0,Pass"
        for i in range(120)
    ]
    (tmp_path / "trace.csv").write_text(HEADER + "\r\n".join(rows) + "\r\n", newline="")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(
        "trace: philly\n"
        "path: trace.csv\n"
        f"tree: {REPO / 'deploy' / 'sim' / 'budget-tree.yaml'}\n"
        "cluster: {nodes: 2, gpus_per_node: 8, gpu_type: V100}\n"
    )
    return scenario


def test_the_cli_writes_metrics_summary_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        sim_app,
        ["run", "--scenario", str(tiny_scenario(tmp_path)), "--out", str(out), "--drain", "2h"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "metrics.json").read_text())
    assert sorted(data["policies"]) == ["budget", "easy", "fifo", "priority"]
    assert data["workload"]["jobs"] == 120
    assert all(p["jobs"]["rejected"] == 24 for p in data["policies"].values())
    summary = (out / "summary.md").read_text()
    assert "- CPU-only jobs: **24** of 120 (20%" in summary
    assert "| policy | owed delivered, worst team | weighted | small teams | worst day |" in summary
    assert all(f"| {name} |" in summary for name in ("budget", "priority", "fifo", "easy"))
    assert "## Start rate and wait by job size" in summary
    headline = data["policies"]["easy"]
    assert list(headline["started_pct_by_size"]) == ["1", "2-8", "9-64", ">64"]
    assert {"owed_delivered_min_pct_by_day", "lost_gpu_h_pct", "sim_cpu_s"} <= set(headline)
    assert set(headline["owed_small_teams"]) == {"count", "owed_pct", "min_pct"}
    assert "owed_delivered_weighted_pct" in headline
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert plots == [
        "jct.png",
        "occupancy.png",
        "owed_by_day.png",
        "owed_delivered.png",
        "preemptions.png",
        "waits.png",
    ]


def test_an_unknown_policy_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        sim_app, ["run", "--scenario", str(tiny_scenario(tmp_path)), "--policy", "lottery"]
    )
    assert result.exit_code != 0
    assert "unknown policy" in result.output


def test_every_trace_is_a_choice_of_the_cli() -> None:
    result = CliRunner().invoke(sim_app, ["run", "--trace", "helios"])
    assert result.exit_code != 0
    flat = " ".join(result.output.replace("│", " ").split())  # the box wraps the line
    assert "'philly', 'alibaba', 'bluewaters', 'theta', 'csv', 'eventlog'" in flat


def test_the_csv_example_runs_and_the_report_counts_teams_placed_by_hash(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        sim_app, ["run", "--trace", "csv", "--policy", "budget", "--no-plots", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert "Quartermaster's generic CSV trace format" in summary  # the scenario's label
    # Four rows name their team; the budget tree lists no members: the rest are hashed.
    assert "**Placed by hash: 6 of 10 jobs, 5 of 7 users.**" in summary
    data = json.loads((out / "metrics.json").read_text())
    assert data["workload"]["placed_by_hash"] == {"jobs": 6, "users": 5}


def test_resumable_work_may_checkpoint_periodically(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "--trace", "csv", "--policy", "budget", "--no-plots", "--checkpoint", "30m"]
    result = CliRunner().invoke(sim_app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Resumable jobs checkpoint every 30 min." in (out / "summary.md").read_text()
    refused = CliRunner().invoke(sim_app, [*args[:-1], "-5s"])
    assert refused.exit_code == 2


def test_a_policy_file_sets_the_knobs_and_flags_override_it(tmp_path: Path) -> None:
    knobs = tmp_path / "policy.yaml"
    knobs.write_text("lookback_window_s: 86400\nmax_min_runtime_s: 3600\nfree_stop_grace_s: 2\n")
    out = tmp_path / "out"
    args = ["run", "--trace", "csv", "--policy", "budget", "--no-plots", "--out", str(out)]
    result = CliRunner().invoke(sim_app, [*args, "--policy-file", str(knobs), "--lookback", "2d"])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "metrics.json").read_text())["policy_config"]
    assert (config["lookback_window_s"], config["max_min_runtime_s"]) == (2 * 86400.0, 3600.0)
    assert "(free work preempted for other work: 2 s)" in (out / "summary.md").read_text()
    knobs.write_text("lookback: 1\n")
    refused = CliRunner().invoke(sim_app, [*args, "--policy-file", str(knobs)])
    assert refused.exit_code == 2
    assert "lookback: unknown key" in refused.output


def test_another_seed_draws_another_team_structure(tmp_path: Path) -> None:
    def summary(*seed: str) -> str:
        out = tmp_path / (seed[-1] if seed else "default")
        args = ["run", "--trace", "csv", "--policy", "budget", "--no-plots", "--out", str(out)]
        result = CliRunner().invoke(sim_app, [*args, *seed])
        assert result.exit_code == 0, result.output
        return (out / "summary.md").read_text()

    # The report names the seed its users were hashed onto teams with.
    assert "`qm-sim`" in summary()
    other = summary("--seed", "held-out")
    assert "`held-out`" in other and "`qm-sim`" not in other
    refused = CliRunner().invoke(sim_app, ["run", "--trace", "csv", "--seed", " "])
    assert refused.exit_code == 2
    assert "give a non-empty seed" in refused.output


@pytest.mark.shared_data
@pytest.mark.parametrize(("trace", "jobs"), [("philly", 14_000), ("bluewaters", 13_861)])
def test_the_shipped_scenarios_are_overloaded_two_to_three_times(trace: str, jobs: int) -> None:
    scenario = load_scenario(REPO / "deploy" / "sim" / f"{trace}.yaml")
    workload = build_workload(scenario, PolicyConfig().max_min_runtime_s)
    assert len(workload.jobs) == jobs
    assert 2.0 <= workload.offered_load() <= 3.0


def test_each_scenario_says_what_its_class_of_workload_is_judged_by() -> None:
    targets = {
        name: load_scenario(REPO / "deploy" / "sim" / f"{name}.yaml").targets
        for name in ("philly", "bluewaters", "theta", "alibaba", "gpushare100")
    }
    assert targets["philly"].worst_team_pct == 97
    assert targets["bluewaters"] == targets["theta"] == Targets()
    assert (targets["alibaba"].worst_team_pct, targets["alibaba"].debug_p90_s) == (90, 60)
    assert targets["gpushare100"].occupancy_pct is None  # a light load is not judged on it


def test_the_verdict_judges_by_the_scenarios_targets(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    out = tmp_path / "out"
    args = ["run", "--scenario", str(scenario), "--policy", "budget", "--no-plots", "--out"]
    assert CliRunner().invoke(sim_app, [*args, str(out)]).exit_code == 0
    default = (out / "summary.md").read_text()
    assert "the worst team ≥ 95% of owed delivered" in default and "occupancy ≥ 95%" in default
    assert "- budget: worst team " in default and ", occupancy " in default
    with scenario.open("a") as f:
        f.write("targets: {worst_team_pct: 90, occupancy_pct: null}\n")
    assert CliRunner().invoke(sim_app, [*args, str(out)]).exit_code == 0
    light = (out / "summary.md").read_text()
    assert "the worst team ≥ 90% of owed delivered" in light and "occupancy ≥" not in light
    assert ", occupancy met" not in light and ", occupancy missed" not in light


def test_the_large_jobs_that_never_started_are_listed_with_what_they_would_have_cost(
    tmp_path: Path,
) -> None:
    # A 1-GPU job runs two hours from the start; the whole cluster's worth, asked for a
    # second later, waits for it past the last submission: it never starts.
    rows = ["0,1,1,0,1,0,7200,0,Pass", "1,2,72,0,1,1,3600,0,Pass", "2,3,1,0,1,10,60,0,Pass"]
    (tmp_path / "trace.csv").write_text(HEADER + "\r\n".join(rows) + "\r\n", newline="")
    scenario = tmp_path / "wide.yaml"
    scenario.write_text(
        "trace: philly\npath: trace.csv\n"
        f"tree: {REPO / 'deploy' / 'sim' / 'budget-tree.yaml'}\n"
        "cluster: {nodes: 9, gpus_per_node: 8, gpu_type: V100}\n"
    )
    out = tmp_path / "out"
    args = ["run", "--scenario", str(scenario), "--policy", "fifo", "--no-plots", "--out"]
    result = CliRunner().invoke(sim_app, [*args, str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "metrics.json").read_text())
    [wide] = data["policies"]["fifo"]["large_never_started"]
    assert (wide["gpus"], wide["gpu_h"], wide["submitted_s"]) == (72, 72.0, 1.0)
    summary = (out / "summary.md").read_text()
    assert "### fifo: 1 job over 64 GPUs never started (72 GPU-hours of work)" in summary
    # The 1-GPU job before it had started when it asked: nothing of its team was ahead.
    assert wide["ahead_gpu_h"] == 0.0
    assert "; 0 had more of their team's work queued before them" in summary


def test_a_large_job_is_behind_its_teams_share_only_with_work_ahead_of_it() -> None:
    def behind(ahead_gpu_h: float, entitled_gpus: float) -> float:
        return _behind(Unstarted("j", "a", 100, 0.0, 3600.0, 1.0, entitled_gpus, ahead_gpu_h))

    assert behind(0.0, 0.0) == 0.0  # no share, but nothing ahead either
    assert behind(50.0, 100.0) == 0.5
    assert behind(200.0, 100.0) == 2.0


def test_durations_read_and_print_like_people_write_them() -> None:
    assert Duration()("7d") == 7 * 86400
    assert Duration()("90") == Duration()("1.5m") == 90
    assert [duration(s) for s in (45, 600, 7200, 3 * 86400)] == ["45 s", "10 min", "2.0 h", "3.0 d"]
    assert table(SUMMARY, [])[1] == []


@pytest.mark.shared_data
def test_the_workflow_sweep_prints_every_mode(tmp_path: Path) -> None:
    args = ["workflows", "--gpus", "16,24", "--jobs", "60", "--out", str(tmp_path)]
    result = CliRunner().invoke(sim_app, args)
    assert result.exit_code == 0, result.output
    assert all(mode in result.output for mode in ("compass", "heft", "hash", "jit"))
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_the_workflow_sweep_refuses_a_negative_hold_threshold() -> None:
    result = CliRunner().invoke(sim_app, ["workflows", "--hold-threshold", "-1"])
    assert result.exit_code == 2
    words = " ".join(result.output.replace("│", " ").split())  # the error box wraps lines
    assert "Invalid value for '--hold-threshold': must be from 0 to 1e+06, got -1" in words
