import pytest

from libs.core.usage import Usage, WindowedUsage

HOUR = 3600.0


def test_a_task_is_charged_once_for_its_gpus_times_its_runtime() -> None:
    usage = WindowedUsage(window_s=24 * HOUR)
    usage.start("j1/0", "team-a", 2, allocated=True, at=100.0)
    usage.end("j1/0", 160.0)
    usage.end("j1/0", 200.0)  # a redelivered end changes nothing
    usage.start("j1/0", "team-a", 2, allocated=True, at=300.0)  # nor a late start
    assert usage.snapshot(1000.0) == {"team-a": Usage(allocated_gpu_s=120.0)}


def test_unallocated_work_is_recorded_apart() -> None:
    usage = WindowedUsage(window_s=HOUR)
    usage.start("j1/0", "team-a", 1, allocated=False, at=0.0)
    usage.end("j1/0", 10.0)
    assert usage.snapshot(20.0) == {"team-a": Usage(unallocated_gpu_s=10.0)}


def test_running_work_counts_up_to_now_and_only_inside_the_window() -> None:
    usage = WindowedUsage(window_s=10 * HOUR)
    usage.start("j1/0", "a", 4, allocated=True, at=0.0)
    assert usage.snapshot(HOUR)["a"].allocated_gpu_s == 4 * HOUR
    assert usage.snapshot(20 * HOUR)["a"].allocated_gpu_s == pytest.approx(4 * 10 * HOUR)


def test_finished_work_leaves_the_window_bucket_by_bucket() -> None:
    usage = WindowedUsage(window_s=2 * HOUR)
    usage.start("j1/0", "a", 1, allocated=True, at=0.0)
    usage.end("j1/0", 3 * HOUR)
    assert usage.snapshot(3 * HOUR)["a"].allocated_gpu_s == pytest.approx(2 * HOUR)
    assert usage.snapshot(6 * HOUR)["a"].allocated_gpu_s == 0.0


def test_a_long_task_ending_late_is_charged_into_the_right_buckets() -> None:
    usage = WindowedUsage(window_s=100 * HOUR)
    usage.start("short/0", "a", 1, allocated=True, at=5 * HOUR)
    usage.start("long/0", "b", 1, allocated=True, at=0.0)
    usage.end("short/0", 6 * HOUR)
    usage.end("long/0", 7 * HOUR)
    assert usage.snapshot(8 * HOUR) == {
        "a": Usage(allocated_gpu_s=HOUR),
        "b": Usage(allocated_gpu_s=7 * HOUR),
    }


def test_gpu_seconds_are_priced_by_gpu_type() -> None:
    usage = WindowedUsage(window_s=24 * HOUR)
    usage.start("h/0", "a", 2, allocated=True, at=0.0, price=2.5)
    usage.end("h/0", 10.0)
    usage.start("c/0", "a", 2, allocated=True, at=0.0)
    assert usage.snapshot(20.0)["a"].allocated_gpu_s == pytest.approx(2 * 10 * 2.5 + 2 * 20)


def test_a_serving_gpu_is_charged_while_held_and_moves_with_its_holder() -> None:
    usage = WindowedUsage(window_s=HOUR)
    usage.hold(("n1", 0), "serving", at=10.0, price=2.0)
    assert usage.snapshot(15.0) == {"serving": Usage(allocated_gpu_s=10.0)}  # while held
    usage.hold(("n1", 0), "other", at=20.0, price=2.0)  # the charge moves: 10 s closed
    usage.release(("n1", 0), 25.0)
    usage.release(("n1", 0), 40.0)  # a GPU not held: nothing
    assert usage.snapshot(50.0) == {
        "other": Usage(allocated_gpu_s=10.0),
        "serving": Usage(allocated_gpu_s=20.0),
    }
