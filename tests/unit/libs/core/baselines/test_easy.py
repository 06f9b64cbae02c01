"""EASY backfill: the head's reservation holds; later jobs start only where they cannot delay it."""

from __future__ import annotations

import random

import pytest

from libs.core import Input, JobArrived, NodeJoined, Place, TaskEnded
from libs.core.baselines import EasyPolicy
from libs.core.model import JobSpec
from libs.sim import SimSettings
from libs.sim.driver import Simulation
from tests.builders import decided, job, node
from tests.unit.libs.sim.sim_builders import spec, workload


def run(seconds: float, gpus: int = 1) -> JobSpec:
    return job(gpus, simulated_duration_s=seconds)


def placed(inputs: list[Input]) -> list[str]:
    return [d.job_id for d in decided(EasyPolicy(), inputs) if isinstance(d, Place)]


def test_a_short_job_backfills_when_it_ends_before_the_reservation() -> None:
    inputs: list[Input] = [
        NodeJoined(0, node("n1")),
        JobArrived(1, "a", run(100, 6)),  # runs until 101
        JobArrived(2, "head", run(10, 8)),  # reserved from 101
        JobArrived(3, "long", run(200, 2)),  # would hold 2 GPUs past 101
        JobArrived(4, "short", run(50, 2)),  # ends at 54
    ]
    assert placed(inputs) == ["a", "short"]
    ends = [TaskEnded(54, "short", "short/0.0", "n1"), TaskEnded(101, "a", "a/0.0", "n1")]
    assert placed([*inputs, *ends]) == ["a", "short", "head"]


def test_a_long_job_backfills_on_gpus_the_head_will_not_need() -> None:
    inputs: list[Input] = [
        NodeJoined(0, node("n1")),
        NodeJoined(0, node("n2")),
        JobArrived(1, "a", run(100, 8)),  # n1 until 101
        JobArrived(2, "b", run(500, 4)),  # n2 until 502
        JobArrived(3, "head", run(10, 8)),  # n1 at 101
        JobArrived(4, "long", run(1000, 4)),  # the rest of n2: not what the head needs
        JobArrived(5, "late", run(10, 1)),  # nothing free
    ]
    assert placed(inputs) == ["a", "b", "long"]


def test_a_job_without_an_estimate_never_counts_as_ending_before_the_reservation() -> None:
    inputs: list[Input] = [
        NodeJoined(0, node("n1")),
        JobArrived(1, "a", run(100, 6)),
        JobArrived(2, "head", run(10, 8)),
        JobArrived(3, "unknown", job(2)),
    ]
    assert placed(inputs) == ["a"]


def test_the_requested_limit_is_the_estimate_not_the_true_runtime() -> None:
    """ "short" truly ends at 54, but asked for 200 s: past the reservation at 101."""
    inputs: list[Input] = [
        NodeJoined(0, node("n1")),
        JobArrived(1, "a", run(100, 6)),
        JobArrived(2, "head", run(10, 8)),
        JobArrived(4, "short", job(2, simulated_duration_s=50, runtime_estimate_s=200)),
        JobArrived(5, "asked", job(2, simulated_duration_s=500, runtime_estimate_s=90)),
    ]
    assert placed(inputs) == ["a", "asked"]


@pytest.mark.parametrize("seed", range(20))
def test_no_backfilled_job_delays_the_heads_reservation(seed: int) -> None:
    """With exact estimates, every head starts by the first shadow time it was given."""
    shadows: dict[str, float] = {}

    class Watched(EasyPolicy):
        def _reservation(self, head: JobSpec) -> tuple[float, dict[str, int]]:
            shadow, free = super()._reservation(head)
            shadows.setdefault(str(self._head()), shadow)
            return shadow, free

    rng = random.Random(seed)
    jobs = []
    at = 0.0
    for i in range(60):
        at += rng.expovariate(1 / 20)
        gpus = rng.choice((1, 1, 2, 3, 4, 6, 8, 12, 16))
        runtime = float(rng.randint(10, 400))
        jobs.append((at, f"j{i}", spec(gpus, simulated_duration_s=runtime), runtime))
    sim = Simulation(workload(*jobs, nodes=3, gpus=8), Watched(), SimSettings(drain_s=1e5))
    sim.run()
    assert shadows
    for job_id, shadow in shadows.items():
        start = sim.agents.jobs[job_id].first_start
        assert start is not None
        assert start <= shadow + 1e-6, job_id
