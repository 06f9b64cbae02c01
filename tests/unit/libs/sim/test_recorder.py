"""Metrics arithmetic: the integrals behind occupancy and owed vs delivered."""

from __future__ import annotations

import pytest

from libs.core.model import JobSpec
from libs.sim.batch import Job
from libs.sim.recorder import Distribution, Recorder, size_class
from libs.sim.workload import SimJob
from tests.unit.libs.sim.sim_builders import spec


def test_owed_delivered_and_occupancy_integrate_the_state_between_changes() -> None:
    rec = Recorder(capacity=10, entitlements={"a": 0.5, "b": 0.5}, start=0.0, end=100.0)
    a, b_waiting, b_running = (
        spec(5, allocation="a"),
        spec(8, allocation="b"),
        spec(2, allocation="b"),
    )
    rec.held(a, 5)
    rec.waiting(b_waiting, 1)
    rec.advance(50.0)
    rec.waiting(b_waiting, -1)
    rec.held(b_running, 2)
    m = rec.finish([], "test", inputs=0)
    by_name = {x.name: x for x in m.allocations}
    assert by_name["a"].owed_gpu_h * 3600 == pytest.approx(500)
    assert by_name["a"].delivered_pct == pytest.approx(100.0)
    # b is owed 5 while it asks 8, then only the 2 it holds.
    assert by_name["b"].owed_gpu_h * 3600 == pytest.approx(5 * 50 + 2 * 50)
    assert by_name["b"].delivered_gpu_h * 3600 == pytest.approx(100)
    assert by_name["b"].demand_fraction == pytest.approx(0.5)
    assert by_name["b"].enough_demand
    assert m.owed_delivered_min_pct == pytest.approx(100 * 100 / 350)
    assert m.owed_delivered_min_enough_demand_pct == m.owed_delivered_min_pct
    assert m.occupancy_pct == pytest.approx(100 * (5 * 100 + 2 * 50) / 1000)
    # Against what could be held: min(10, 5 + 8) for 50 s, then 7.
    assert m.occupancy_of_demand_pct == pytest.approx(100 * 600 / (10 * 50 + 7 * 50))


def test_a_job_no_placement_could_serve_is_not_owed() -> None:
    rec = Recorder(capacity=8, entitlements={"a": 1.0}, start=0.0, end=10.0)
    rec.waiting(spec(9, allocation="a"), 1)  # larger than the cluster
    rec.waiting(spec(2, allocation="a"), 1)
    rec.advance(10.0)
    m = rec.finish([], "test", inputs=0)
    (a,) = m.allocations
    assert a.owed_gpu_h * 3600 == pytest.approx(2 * 10)
    assert m.occupancy_of_demand_pct == 0.0


def test_free_work_is_neither_owed_nor_delivered() -> None:
    rec = Recorder(capacity=4, entitlements={"a": 1.0}, start=0.0, end=10.0)
    rec.held(spec(4, min_runtime_s=0), 4)
    m = rec.finish([], "test", inputs=0)
    (a,) = m.allocations
    assert (a.owed_gpu_h, a.delivered_gpu_h, a.free_gpu_h * 3600) == (0.0, 0.0, 40.0)
    assert not a.enough_demand
    assert m.owed_delivered_min_pct is None
    assert m.owed_delivered_min_pct_by_day == (None,)
    assert m.occupancy_pct == 100.0


def test_the_headline_counts_every_team_owed_enough_and_each_day() -> None:
    day = 86_400.0
    rec = Recorder(capacity=10, entitlements={"a": 0.5, "b": 0.5}, start=0.0, end=2.5 * day)
    rec.held(spec(5, allocation="a"), 5)  # a has what it is owed throughout
    rec.waiting(spec(2, allocation="b"), 1)  # b asks for little and gets nothing...
    rec.advance(1.5 * day)
    rec.waiting(spec(2, allocation="b"), -1)
    rec.held(spec(2, allocation="b"), 2)  # ...until half-way through the second day
    m = rec.finish([], "test", inputs=0)
    b = {x.name: x for x in m.allocations}["b"]
    assert not b.enough_demand
    assert m.owed_delivered_min_enough_demand_pct == pytest.approx(100.0)
    assert m.owed_delivered_min_pct == pytest.approx(100 * 1.0 / 2.5)
    assert b.owed_gpu_h_by_day == pytest.approx((48.0, 48.0, 24.0))
    assert m.owed_delivered_min_pct_by_day == pytest.approx((0.0, 50.0, 100.0))


def test_a_team_owed_under_the_floor_is_reported_apart_and_counted_in_the_weighted() -> None:
    day = 86_400.0
    rec = Recorder(capacity=1000, entitlements={"a": 0.5, "b": 0.5}, start=0.0, end=day)
    rec.held(spec(500, allocation="a"), 500)  # a has what it is owed throughout
    rec.waiting(spec(1, allocation="b"), 1)  # b waits 60 s for one GPU, and never gets it
    rec.advance(60.0)
    rec.waiting(spec(1, allocation="b"), -1)
    m = rec.finish([], "test", inputs=0)
    # b is owed 60 GPU-seconds of 86.4 M: under 0.1 %, so a alone is the worst team.
    assert m.owed_delivered_min_pct == pytest.approx(100.0)
    assert m.owed_delivered_min_pct_by_day == pytest.approx((100.0,))
    small = m.owed_small_teams
    assert (small.count, small.min_pct) == (1, 0.0)
    assert small.owed_pct == pytest.approx(100 * 60 / (500 * day + 60))
    assert m.owed_delivered_weighted_pct == pytest.approx(100 * 500 * day / (500 * day + 60))
    assert [(a.name, a.small_team) for a in m.allocations] == [("a", False), ("b", True)]


def test_start_rates_and_waits_by_size_count_the_jobs_that_fit() -> None:
    rec = Recorder(
        capacity=16, entitlements={"a": 1.0}, start=0.0, end=100.0, gpus_of_type={"H100": 16}
    )
    jobs = [
        started(spec(1), at=0.0, first_start=10.0),  # debug work
        started(spec(1, min_runtime_s=3600), at=0.0, first_start=None),
        started(spec(12), at=50.0, first_start=None),
        started(spec(32), at=0.0, first_start=None),  # larger than the cluster
        started(spec(4, gpu_type="A100"), at=0.0, first_start=None),  # no such GPUs
    ]
    m = rec.finish(jobs, "test", inputs=0)
    assert m.started_pct_by_size == {"1": 50.0, "2-8": None, "9-64": 0.0, ">64": None}
    debug = {"1": 100.0, "2-8": None, "9-64": None, ">64": None}
    assert m.started_pct_by_size_and_class["debug"] == debug
    allocated = m.started_pct_by_size_and_class["allocated"]
    assert allocated == {"1": 0.0, "2-8": None, "9-64": 0.0, ">64": None}
    assert m.waits_by_size["1"].count == 2
    assert m.waits_by_size["9-64"].p50 == 50.0
    assert size_class(0) == size_class(1) == "1"
    assert [size_class(n) for n in (2, 8, 9, 64, 65)] == ["2-8", "2-8", "9-64", "9-64", ">64"]


def started(s: JobSpec, at: float, first_start: float | None) -> Job:
    return Job(SimJob(at, "j", s, 10.0), first_start=first_start)


def test_a_large_job_that_never_started_is_reported_with_its_cost() -> None:
    rec = Recorder(capacity=128, entitlements={"a": 0.25}, start=100.0, end=1000.0)
    jobs = [
        Job(SimJob(400.0, "wide", spec(100, allocation="a"), 7200.0)),  # never started
        Job(SimJob(300.0, "ran", spec(100, allocation="a"), 60.0), first_start=350.0),
        Job(SimJob(500.0, "huge", spec(256, allocation="a"), 60.0)),  # larger than the cluster
    ]
    m = rec.finish(jobs, "test", inputs=0)
    [wide] = m.large_never_started
    assert (wide.job_id, wide.allocation, wide.gpus) == ("wide", "a", 100)
    assert (wide.submitted_s, wide.waited_s) == (300.0, 600.0)
    assert (wide.gpu_h, wide.entitled_gpus) == (200.0, 32.0)
    assert wide.ahead_gpu_h == 0.0  # "ran" had started when it asked


def test_a_large_job_that_never_started_counts_its_teams_work_queued_before_it() -> None:
    rec = Recorder(capacity=128, entitlements={"a": 0.25, "b": 0.75}, start=0.0, end=3600.0)
    cancelled = Job(SimJob(3.0, "gone", spec(8, allocation="a"), 3600.0), state="cancelled")
    jobs = [
        Job(SimJob(0.0, "ahead", spec(4, allocation="a"), 1800.0)),  # waits: 2 GPU-h
        Job(SimJob(1.0, "first", spec(8, allocation="a", priority=1), 3600.0), first_start=60.0),
        Job(SimJob(2.0, "low", spec(8, allocation="a", priority=-1), 3600.0)),  # after it
        Job(SimJob(3.0, "other", spec(8, allocation="b"), 3600.0)),  # another team
        cancelled,  # cancelled: it asks for nothing
        Job(SimJob(4.0, "free", spec(8, allocation="a", min_runtime_s=0), 3600.0)),  # a class
        Job(SimJob(5.0, "started", spec(8, allocation="a"), 3600.0), first_start=5.0),
        Job(SimJob(10.0, "wide", spec(100, allocation="a"), 60.0)),
        Job(SimJob(20.0, "later", spec(8, allocation="a", priority=2), 3600.0)),  # later
    ]
    m = rec.finish(jobs, "test", inputs=0)
    [wide] = m.large_never_started
    # "first" started after "wide" asked, so it was still ahead of it: 8 GPU-h.
    assert wide.ahead_gpu_h == pytest.approx(2.0 + 8.0)


def test_samples_hold_the_state_at_each_step() -> None:
    rec = Recorder(capacity=4, entitlements={"a": 1.0}, start=0.0, end=30.0, sample_s=10.0)
    job = spec(2, min_runtime_s=3600)
    rec.held(job, 2)
    rec.advance(15.0)
    rec.held(job, -2)
    m = rec.finish([], "test", inputs=0)
    assert m.series.busy["allocated"] == [2, 2, 0, 0]


def test_percentiles_interpolate_between_ranks() -> None:
    assert Distribution.of([1.0, 2.0, 3.0, 4.0]).p50 == 2.5
    assert Distribution.of([5.0]).p90 == 5.0
    d = Distribution.of([float(v) for v in range(101)])
    assert (d.p50, d.p90, d.p99, d.count) == (50.0, 90.0, 99.0, 101)
    assert Distribution.of([]).count == 0


def test_a_cancelled_large_job_alone_in_its_class_has_nothing_ahead() -> None:
    rec = Recorder(capacity=128, entitlements={"a": 1.0}, start=0.0, end=3600.0)
    wide = Job(SimJob(10.0, "wide", spec(100, allocation="a"), 60.0), state="cancelled")
    [reported] = rec.finish([wide], "test", inputs=0).large_never_started
    assert reported.ahead_gpu_h == 0.0
