"""Idle detection as a pure function of timed samples."""

from __future__ import annotations

import pytest

from services.node_agent.idle import IdleDetector, IdleThresholds, Transition, task_utilization

# A 10 s window sampled every 10 s holds one sample: the mean is the sample itself.
ONE_SAMPLE = IdleThresholds(idle_below=0.05, busy_above=0.15, window_s=10)


def feed(detector: IdleDetector, levels: list[float], *, task_id: str = "t") -> list[list[bool]]:
    """One sample every 10 s from t=0; the idle states reported after each."""
    return [
        [change.idle for change in detector.observe(10.0 * step, {task_id: level})]
        for step, level in enumerate(levels)
    ]


def test_a_task_goes_idle_once_a_full_window_is_below_the_threshold() -> None:
    detector = IdleDetector(IdleThresholds(window_s=30))
    assert [detector.observe(at, {"t": 0.0}) for at in (0, 10, 20)] == [[], [], []]
    assert detector.observe(30, {"t": 0.0}) == [Transition("t", idle=True, utilization=0.0)]
    assert detector.observe(40, {"t": 0.0}) == []  # only transitions are reported


def test_the_mean_is_over_the_window_only() -> None:
    detector = IdleDetector(IdleThresholds(window_s=30))
    for at, level in ((0, 0.9), (10, 0.0), (20, 0.0)):
        assert detector.observe(at, {"t": level}) == []
    # The sample at t=0 has left the window (10, 40]: mean (0 + 0 + 0.12) / 3.
    (change,) = detector.observe(30, {"t": 0.12})
    assert change.idle
    assert change.utilization == pytest.approx(0.04)


def test_hysteresis_keeps_a_task_between_the_thresholds_from_flapping() -> None:
    detector = IdleDetector(ONE_SAMPLE)
    levels = [0.04, 0.04, 0.10, 0.04, 0.14, 0.16, 0.10, 0.06, 0.04, 0.05]
    assert feed(detector, levels) == [[], [True], [], [], [], [False], [], [], [True], []]


def test_the_busy_transition_reports_the_mean_that_decided_it() -> None:
    detector = IdleDetector(IdleThresholds(window_s=20))
    for at in (0, 10, 20):
        detector.observe(at, {"t": 0.0})
    assert detector.observe(30, {"t": 0.25}) == []  # mean 0.125: not above 0.15
    assert detector.observe(40, {"t": 0.75}) == [Transition("t", idle=False, utilization=0.5)]


def test_tasks_are_judged_independently() -> None:
    detector = IdleDetector(ONE_SAMPLE)
    assert detector.observe(0, {"a": 0.0, "b": 0.0}) == []
    # c started late: its window is not full yet, a is busy.
    assert detector.observe(10, {"a": 0.9, "b": 0.0, "c": 0.0}) == [Transition("b", True, 0.0)]
    assert detector.observe(20, {"a": 0.9, "b": 0.0, "c": 0.0}) == [Transition("c", True, 0.0)]


def test_a_task_that_ended_is_forgotten() -> None:
    detector = IdleDetector(ONE_SAMPLE)
    assert feed(detector, [0.0, 0.0]) == [[], [True]]
    assert detector.observe(20, {}) == []
    # The same id again is a new task: busy, with a window of its own to fill.
    assert detector.observe(30, {"t": 0.0}) == []
    assert detector.observe(40, {"t": 0.0}) == [Transition("t", True, 0.0)]


def test_an_idle_threshold_of_zero_turns_detection_off() -> None:
    detector = IdleDetector(IdleThresholds(idle_below=0, busy_above=0.15, window_s=10))
    assert feed(detector, [0.0] * 5) == [[]] * 5


@pytest.mark.parametrize(
    ("idle", "busy", "window_s", "message"),
    [
        (0.2, 0.1, 300, "need 0 <= idle threshold <= busy threshold <= 1, got 0.2 and 0.1"),
        (-0.1, 0.1, 300, "need 0 <= idle threshold"),
        (0.05, 1.5, 300, "need 0 <= idle threshold"),
        (0.05, 0.15, 0, "the idle window must be > 0 seconds, got 0"),
    ],
)
def test_thresholds_are_checked(idle: float, busy: float, window_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IdleThresholds(idle, busy, window_s)


def test_a_task_utilisation_is_the_mean_of_its_gpus() -> None:
    assert task_utilization({0: 1.0, 1: 0.0, 2: 0.5}, [0, 2]) == 0.75
