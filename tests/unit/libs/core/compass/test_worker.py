"""GpuWorker: one GPU's serving queue and model cache, with look-ahead eviction."""

from __future__ import annotations

import dataclasses

import pytest

from libs.core.compass import CacheModel, GpuWorker
from libs.core.decisions import ServingTask

BW = 10.0  # MB/ms


def task(
    name: str,
    model: str,
    mb: float = 1000.0,
    run_ms: float = 100.0,
    upcoming: tuple[str, ...] = (),
) -> ServingTask:
    return ServingTask(name, model, mb, run_ms, 0.0, upcoming)


def test_miss_then_hit_and_times() -> None:
    w = GpuWorker(capacity_mb=4000, host_to_gpu_mb_per_ms=BW)
    w.enqueue("a", task("a", "m1", 1000, run_ms=50), ready_ms=0)
    w.enqueue("b", task("b", "m1", 1000, run_ms=70), ready_ms=0)
    first = w.start(10)
    assert first is not None
    assert (first.task_id, first.loaded, first.hit, first.load_ms) == ("a", True, False, 100.0)
    assert (first.start_ms, first.finish_ms) == (110.0, 160.0)
    assert w.start(20) is None  # busy: one task at a time
    assert w.finish("a")
    second = w.start(160)
    assert second is not None
    assert (second.task_id, second.loaded, second.hit, second.load_ms) == ("b", False, True, 0.0)
    assert (second.start_ms, second.finish_ms) == (160.0, 230.0)
    assert dict(w.resident) == {"m1": 1000}


def test_waits_for_inputs_and_tells_when_to_wake() -> None:
    w = GpuWorker(4000, BW)
    w.enqueue("late", task("late", "m1"), ready_ms=500)
    w.enqueue("later", task("later", "m2"), ready_ms=800)
    assert w.start(100) is None
    assert w.next_ready_ms() == 500
    assert w.next_ready_ms(now_ms=600) == 800
    started = w.start(500)
    assert started is not None and started.task_id == "late"
    assert w.next_ready_ms() == 800


def test_earliest_enqueued_ready_task_goes_first() -> None:
    w = GpuWorker(4000, BW)
    w.enqueue("x", task("x", "m1"), ready_ms=300)
    w.enqueue("y", task("y", "m2"), ready_ms=200)
    w.enqueue("z", task("z", "m3"), ready_ms=100)
    s = w.start(250)  # x not ready; y enqueued before z
    assert s is not None and s.task_id == "y"


def test_look_ahead_evicts_unneeded_then_furthest() -> None:
    w = GpuWorker(3000, BW, resident={"keep_q": 1000, "up_far": 1000, "unused": 1000})
    w.enqueue("q", task("q", "keep_q"), ready_ms=0)
    # The new model needs 2000 MB: "unused" goes first, then the one needed furthest.
    w.enqueue("new", task("new", "big", 2000, upcoming=("up_far",)), ready_ms=0)
    w.enqueue("q2", task("q2", "keep_q"), ready_ms=0)
    first = w.start(0)
    assert first is not None and first.task_id == "q" and first.hit
    w.finish("q")
    s = w.start(0)
    assert s is not None and s.task_id == "new"
    assert [e.model for e in s.evicted] == ["unused", "up_far"]
    assert "no queued or upcoming task needs it" in s.evicted[0].reason
    assert "next needed" in s.evicted[1].reason
    assert dict(w.resident) == {"keep_q": 1000, "big": 2000}


def test_queued_models_outrank_upcoming_ones() -> None:
    w = GpuWorker(3000, BW, resident={"m_up": 1000, "m_queued": 1000})
    w.enqueue("new", task("new", "m_new", 2000, upcoming=("m_up",)), ready_ms=0)
    w.enqueue("later", task("later", "m_queued"), ready_ms=50)
    s = w.start(0)
    assert s is not None
    assert [e.model for e in s.evicted] == ["m_up"]
    assert "m_queued" in w.resident


def test_never_evicts_the_running_model() -> None:
    w = GpuWorker(2000, BW, resident={"m1": 1000, "m2": 1000})
    w.enqueue("a", task("a", "m1"), ready_ms=0)
    running = w.start(0)
    assert running is not None and running.hit and running.evicted == ()
    dropped = w.evict_all("GPU taken by batch job J")
    assert [e.model for e in dropped] == ["m2"]
    assert dropped[0].reason == "GPU taken by batch job J"
    assert dict(w.resident) == {"m1": 1000}
    w.finish("a")
    assert [e.model for e in w.evict_all("batch")] == ["m1"]
    assert dict(w.resident) == {}


def test_the_started_model_is_never_a_victim_of_its_own_load() -> None:
    # The started task's model is pinned even when the queue names nothing else.
    w = GpuWorker(2000, BW, resident={"old": 1500})
    w.enqueue("a", task("a", "new", 1000, upcoming=("old",)), ready_ms=0)
    s = w.start(0)
    assert s is not None
    assert [e.model for e in s.evicted] == ["old"]
    assert "new" in w.resident


def test_oversized_model_evicts_all_and_loads_anyway() -> None:
    w = GpuWorker(1000, BW, resident={"small": 500})
    w.enqueue("huge", task("huge", "giant", 5000, run_ms=10), ready_ms=0)
    w.enqueue("next", task("next", "small", 500), ready_ms=0)
    s = w.start(0)
    assert s is not None and s.oversized and s.loaded
    assert [e.model for e in s.evicted] == ["small"]
    assert s.load_ms == 500.0
    w.finish("huge")
    # The queue moves on: the giant model is simply evicted next.
    nxt = w.start(600)
    assert nxt is not None and nxt.task_id == "next"
    assert [e.model for e in nxt.evicted] == ["giant"]


def test_task_without_model_neither_loads_nor_evicts() -> None:
    w = GpuWorker(1000, BW, resident={"m": 1000})
    w.enqueue("glue", task("glue", "", 0, run_ms=1), ready_ms=0)
    s = w.start(5)
    assert s is not None and not s.loaded and not s.hit and s.evicted == ()
    assert (s.start_ms, s.finish_ms) == (5.0, 6.0)


def test_duplicates_remove_and_finish_of_unknown() -> None:
    w = GpuWorker(1000, BW)
    assert w.enqueue("a", task("a", "m"), 0)
    assert not w.enqueue("a", task("a", "m"), 0)
    assert w.enqueue("b", task("b", "m"), 0)
    removed = w.remove("b")
    assert removed is not None and removed.task_id == "b"
    assert w.remove("b") is None
    assert not w.finish("a")  # queued, not running
    s = w.start(0)
    assert s is not None
    assert not w.enqueue("a", task("a", "m"), 0)  # running
    assert w.remove("a") is None
    assert w.finish("a") and w.idle


def test_bandwidth_must_be_positive() -> None:
    with pytest.raises(ValueError):
        GpuWorker(1000, 0)


def test_an_interrupted_load_is_forgotten() -> None:
    w = GpuWorker(1000, BW)
    w.enqueue("a", task("a", "m"), 0)
    s = w.start(0)
    assert s is not None and s.loaded
    assert w.forget("m") and not w.forget("m")
    w.finish("a")
    w.enqueue("b", task("b", "m"), 0)
    again = w.start(0)
    assert again is not None and again.loaded


def test_resident_is_kept_least_recently_used_first() -> None:
    w = GpuWorker(3000, BW, resident={"a": 1000, "b": 1000})
    w.enqueue("t", task("t", "a"), 0)
    w.start(0)
    w.finish("t")
    assert list(w.resident) == ["b", "a"]


def test_fifo_cost_evicts_the_first_loaded_and_charges_each_eviction() -> None:
    w = GpuWorker(
        3000, BW, resident={"old": 1000, "mid": 1000, "new": 1000}, cache_model=CacheModel.FIFO_COST
    )
    w.enqueue("hit", task("hit", "old"), 0)
    w.enqueue("next", task("next", "old"), 0)  # wanted again: look-ahead would keep it
    w.enqueue("miss", task("miss", "big", 2000), 0)
    first = w.start(0)
    assert first is not None and first.hit and first.load_ms == 0
    assert list(w.resident) == ["old", "mid", "new"]  # a hit moves nothing
    w.finish("hit")
    w.start(0)
    w.finish("next")
    s = w.start(100)
    assert s is not None and s.task_id == "miss"
    assert [e.model for e in s.evicted] == ["old", "mid"]
    assert all("loaded before the models kept" in e.reason for e in s.evicted)
    # Each eviction moves its 1000 MB off the GPU (100 ms each) before the 200 ms load.
    assert (s.load_ms, s.start_ms, s.finish_ms) == (400.0, 500.0, 600.0)
    assert dict(w.resident) == {"new": 1000, "big": 2000}


def test_the_wait_plays_the_queue_forward_as_the_gpu_would_take_it() -> None:
    w = GpuWorker(4000, BW)
    assert w.wait_ms(0) == w.wait_ms(0, ready_ms=50) == 0
    w.enqueue("a", task("a", "m1", 1000, run_ms=50), ready_ms=0)
    assert w.start(0) is not None  # m1 loads (100 ms), runs till 150
    w.enqueue("b", task("b", "m2", 500, run_ms=70), ready_ms=0)  # loads m2 (50 ms) first
    w.enqueue("c", task("c", "m2", 500, run_ms=30), ready_ms=400)  # m2 is there by then
    # Ready at 100: after a's rest (50), b's load and run (120); c's inputs come later.
    assert w.wait_ms(100) == pytest.approx(50 + 50 + 70)
    # Ready at 400: c's inputs are there too, and it was queued first; m2 is loaded.
    assert w.wait_ms(100, ready_ms=400) == pytest.approx(30)
    # Ready at 300, when the GPU is idle: at once.
    assert w.wait_ms(100, ready_ms=300) == 0


def test_a_task_is_refused_only_past_its_wait_limit() -> None:
    w = GpuWorker(4000, BW)
    w.enqueue("a", task("a", "", run_ms=200), ready_ms=0)
    limited = dataclasses.replace(task("b", ""), wait_limit_ms=150.0)
    assert w.refuses(limited, 0) == 200  # 200 ms ahead of it
    assert w.refuses(limited, 0) is not None and [q.task_id for q in w.queue] == ["a"]
    assert w.refuses(dataclasses.replace(limited, wait_limit_ms=200.0), 0) is None
    assert w.refuses(task("b", ""), 0) is None  # no limit: never refused
