"""The driver on hand-made traces: lifecycles, stops, requeues, snapshots, invariants."""

from __future__ import annotations

import dataclasses

import pytest

from libs.core import (
    Decision,
    Input,
    JobArrived,
    Place,
    PolicyConfig,
    Requeue,
    Stop,
    StopCause,
    TaskEnded,
    TaskStarted,
    UsageSnapshot,
)
from libs.core.baselines import FifoPolicy
from libs.sim import POLICIES, SimSettings, SimulationError, make_policy, simulate
from tests.unit.libs.sim.sim_builders import Recording, Scripted, spec, workload

SETTINGS = SimSettings(drain_s=1000.0, stop_grace_s=30.0)


def ended(policy: Scripted | Recording) -> list[tuple[float, str, int]]:
    return [(e.at, e.task_id, e.exit_code) for e in policy.inputs if isinstance(e, TaskEnded)]


def test_a_job_runs_for_its_runtime() -> None:
    policy = Recording(FifoPolicy())
    metrics = simulate(workload((0.0, "j1", spec(1), 100.0)), policy, SETTINGS)
    assert ended(policy) == [(100.0, "j1/0.0", 0)]
    started = [e for e in policy.inputs if isinstance(e, TaskStarted)]
    assert [(e.at, e.task_id) for e in started] == [(0.0, "j1/0.0")]
    assert metrics.jobs == {"finished": 1}
    assert metrics.jct["all"].p50 == 100.0
    assert metrics.waits["all"].p50 == 0.0
    assert metrics.occupancy_pct == pytest.approx(100 * 100 / (4 * 1000))


def test_a_gang_starts_and_ends_together() -> None:
    policy = Recording(FifoPolicy())
    simulate(workload((0.0, "g", spec(8), 50.0), nodes=2), policy, SETTINGS)
    assert ended(policy) == [(50.0, "g/0.0", 0), (50.0, "g/0.1", 0)]


def preempt_then(resume: bool) -> Scripted:
    """Places j1; j2's arrival stops it; when it has ended, requeue and place it again."""
    s = spec(1, resumable=resume)

    def react(event: Input) -> list[Decision]:
        match event:
            case JobArrived(job_id="j1"):
                return [Place("j1", "j1/0", "node-0", (0,), s)]
            case JobArrived(job_id="j2"):
                return [Stop("j1", "j1/0", "node-0", StopCause.PREEMPTED, "make room")]
            case TaskEnded(task_id="j1/0"):
                return [Requeue("j1", "again"), Place("j1", "j1/1", "node-0", (1,), s)]
        return []

    return Scripted(react)


def test_a_stop_ends_the_task_after_the_grace_and_requeue_resumes_it() -> None:
    policy = preempt_then(resume=True)
    w = workload((0.0, "j1", spec(1), 100.0), (60.0, "j2", spec(1), 10.0))
    metrics = simulate(w, policy, SETTINGS)
    # Stopped at 60, ended at 90 (SIGTERM), resumed with 40 s of work left.
    assert ended(policy) == [(90.0, "j1/0", 143), (130.0, "j1/1", 0)]
    assert metrics.preemptions["debug"] == 1
    assert metrics.requeues == 1
    assert metrics.lost_gpu_h == 0.0


def test_requeued_work_that_is_not_resumable_starts_over() -> None:
    policy = preempt_then(resume=False)
    w = workload((0.0, "j1", spec(1, resumable=False), 100.0), (60.0, "j2", spec(1), 10.0))
    metrics = simulate(w, policy, SETTINGS)
    assert ended(policy) == [(90.0, "j1/0", 143), (190.0, "j1/1", 0)]
    assert metrics.lost_gpu_h == pytest.approx(60 / 3600)


def test_resumable_work_resumes_from_its_last_checkpoint() -> None:
    policy = preempt_then(resume=True)
    w = workload((0.0, "j1", spec(1), 100.0), (60.0, "j2", spec(1), 10.0))
    metrics = simulate(w, policy, dataclasses.replace(SETTINGS, checkpoint_s=25.0))
    # Stopped at 60 with a checkpoint at 50: 10 s lost, 50 s of work left after 90.
    assert ended(policy) == [(90.0, "j1/0", 143), (140.0, "j1/1", 0)]
    assert metrics.lost_gpu_h == pytest.approx(10 / 3600)
    assert metrics.lost_gpu_h_pct == pytest.approx(100 * 10 / (4 * 1060))


def test_a_job_whose_work_runs_out_within_the_grace_finishes() -> None:
    policy = preempt_then(resume=True)
    w = workload((0.0, "j1", spec(1), 70.0), (60.0, "j2", spec(1), 10.0))
    metrics = simulate(w, policy, SETTINGS)
    assert ended(policy)[0] == (70.0, "j1/0", 0)
    assert metrics.jobs["finished"] == 1


def test_a_gpu_given_twice_stops_the_run() -> None:
    def react(event: Input) -> list[Decision]:
        if isinstance(event, JobArrived):
            return [Place(event.job_id, f"{event.job_id}/0", "node-0", (0,), event.spec)]
        return []

    w = workload((0.0, "j1", spec(1), 100.0), (1.0, "j2", spec(1), 100.0))
    with pytest.raises(SimulationError, match="GPU 0 of node-0 is not free"):
        simulate(w, Scripted(react), SETTINGS)


def test_snapshots_carry_the_windowed_usage_of_charged_work() -> None:
    def react(event: Input) -> list[Decision]:
        if isinstance(event, JobArrived) and event.job_id == "run":
            return [Place("run", "run/0", "node-0", (0, 1), event.spec)]
        return []  # "wait" never starts, so snapshots keep coming

    policy = Scripted(react)
    w = workload((0.0, "run", spec(2), 5000.0), (0.0, "wait", spec(1, allocation="b"), 1.0))
    simulate(w, policy, dataclasses.replace(SETTINGS, snapshot_s=300.0))
    snapshots = {e.at: dict(e.usage) for e in policy.inputs if isinstance(e, UsageSnapshot)}
    assert snapshots[600.0] == {"a": 1200.0}
    assert sorted(snapshots)[:3] == [0.0, 300.0, 600.0]


def test_a_job_still_waiting_counts_its_wait_so_far() -> None:
    w = workload((0.0, "big", spec(4), 1000.0), (10.0, "next", spec(4), 10.0))
    metrics = simulate(w, FifoPolicy(), dataclasses.replace(SETTINGS, drain_s=500.0))
    assert metrics.jobs == {"running": 1, "waiting": 1}
    assert metrics.waits["allocated"].p90 == pytest.approx(0.0 + 0.9 * 500.0)


@pytest.mark.parametrize("name", POLICIES)
def test_runs_are_deterministic(name: str) -> None:
    jobs = [
        (float(i * 7 % 50), f"j{i:02d}", spec(1 + i % 4, allocation="ab"[i % 2]), 30.0 + i)
        for i in range(40)
    ]
    w = workload(*sorted(jobs), nodes=2)
    first = simulate(w, make_policy(name, PolicyConfig()), SETTINGS)
    second = simulate(w, make_policy(name, PolicyConfig()), SETTINGS)
    assert first == second
    assert first.jobs == {"finished": 40}


def test_progress_is_heard_as_simulated_time_advances() -> None:
    w = workload((0.0, "a", spec(1), 100.0), (400.0, "b", spec(1), 100.0))
    heard: list[float] = []
    simulate(
        w, FifoPolicy(), dataclasses.replace(SETTINGS, drain_s=600.0), on_progress=heard.append
    )
    assert heard[0] == 0.0 and heard == sorted(heard) and heard[-1] <= 1.0
    assert len(heard) > 2  # more than start and end: the ticks report too


def test_the_warmup_is_simulated_but_not_measured() -> None:
    w = workload((0.0, "early", spec(4), 100.0), (200.0, "late", spec(1), 100.0))
    metrics = simulate(w, FifoPolicy(), SimSettings(drain_s=800.0, warmup_s=100.0))
    assert (metrics.start, metrics.end) == (100.0, 1000.0)
    assert metrics.jobs == {"finished": 1}
    assert metrics.occupancy_pct == pytest.approx(100 * 100 / (4 * 900))


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_only_jobs_are_rejected_and_counted_apart(policy: str) -> None:
    load = workload((0.0, "cpu", spec(0), 100.0), (1.0, "gpu", spec(1), 100.0))
    metrics = simulate(load, make_policy(policy, PolicyConfig()), SETTINGS)
    assert metrics.jobs == {"finished": 1, "rejected": 1}
    assert metrics.waits["all"].count == 1  # a rejected job never waited
