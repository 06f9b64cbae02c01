"""The simulated cluster on its own: starts, stops, ends, serving caches, refusals."""

from __future__ import annotations

import dataclasses

import pytest

from libs.core import JobSpec, NodeSpec
from libs.core.decisions import Place, ServingTask
from libs.core.inputs import Input, ModelEvicted, TaskEnded, TaskRefused, TaskStarted
from libs.core.usage import WindowedUsage
from libs.sim.world import SIGTERM_EXIT, SimulationError, World

SPEC = JobSpec("a", "u", 1, ("x",), min_runtime_s=600)


def world(**kw: object) -> tuple[World, list[Input]]:
    """Two 2-GPU nodes; every report, due now or later, lands in the returned list."""
    heard: list[Input] = []
    w = World(deliver=heard.append, **kw)  # type: ignore[arg-type]
    for name in ("n0", "n1"):
        w.join(NodeSpec(name, "H100", (0, 1), 80.0))
    return w, heard


def run(w: World, heard: list[Input], until: float = float("inf")) -> None:
    """Play the agenda up to ``until``: reports are heard, the world's own entries acted on."""
    while (due := w.next_at()) is not None and due[0] <= until:
        entry = w.pop()
        if not w.handle(entry):
            heard.append(entry)  # type: ignore[arg-type]


def place(task_id: str, node: str = "n0", gpus: tuple[int, ...] = (0,)) -> Place:
    return Place(task_id.split("/")[0], task_id, node, gpus, SPEC)


def test_a_placed_task_holds_its_gpus_and_starts_after_the_start_delay() -> None:
    w, heard = world(start_delay_s=1.0)
    w.start(place("j/0", gpus=(0, 1)))
    assert w.gpus[("n0", 0)] == w.gpus[("n0", 1)] == "j/0"
    assert heard == []  # not yet
    run(w, heard)
    assert heard == [TaskStarted(1.0, "j", "j/0", "n0")]


def test_an_ended_task_frees_its_gpus_and_says_so_at_once() -> None:
    w, heard = world()
    w.start(place("j/0"))
    run(w, heard)
    w.now = 50.0
    w.end("j/0")
    assert heard[-1] == TaskEnded(50.0, "j", "j/0", "n0", 0)
    assert w.gpus[("n0", 0)] is None and "j/0" not in w.tasks


def test_a_stopped_task_ends_after_the_grace_with_sigterm_and_only_once() -> None:
    w, heard = world(stop_grace_s=30.0)
    w.start(place("j/0"))
    run(w, heard)
    w.now = 10.0
    assert w.stop("j/0")
    assert not w.stop("j/0")  # already stopping
    run(w, heard, until=39.0)
    assert "j/0" in w.tasks  # still in its grace
    run(w, heard)
    assert heard[-1] == TaskEnded(40.0, "j", "j/0", "n0", SIGTERM_EXIT)
    assert not w.stop("j/0")  # gone


def test_a_stop_may_shorten_the_grace_never_lengthen_it() -> None:
    w, heard = world(stop_grace_s=30.0)
    for task_id, asked_s in (("j/0", 5.0), ("j/1", 60.0)):
        w.start(place(task_id, gpus=(int(task_id[-1]),)))
        assert w.stop(task_id, asked_s)
    run(w, heard)
    ends = [(e.task_id, e.at) for e in heard if isinstance(e, TaskEnded)]
    assert ends == [("j/0", 5.0), ("j/1", 30.0)]


def test_a_task_that_ends_within_its_grace_is_not_ended_again() -> None:
    w, heard = world(stop_grace_s=30.0)
    w.start(place("j/0"))
    run(w, heard)
    w.stop("j/0")
    w.now = 5.0
    w.end("j/0")  # its work ran out
    run(w, heard)
    assert heard[1:] == [TaskEnded(5.0, "j", "j/0", "n0", 0)]


def test_a_gpu_given_twice_is_refused() -> None:
    w, _ = world()
    w.start(place("a/0", gpus=(0, 1)))
    with pytest.raises(SimulationError, match="b/0: GPU 1 of n0 is not free"):
        w.start(place("b/0", gpus=(1,)))
    with pytest.raises(SimulationError, match="placed on unknown node n9"):
        w.start(place("c/0", node="n9"))
    with pytest.raises(SimulationError, match="GPU 5 of n1 is not free"):
        w.start(place("d/0", node="n1", gpus=(5,)))
    assert w.gpus[("n1", 0)] is None  # a refused placement takes nothing


def serving(task_id: str, model: str, node: str = "n0") -> Place:
    task = ServingTask(task_id.split("/")[1], model, 30_000.0, 100.0, 0.0, ())
    return Place(task_id.split("/")[0], task_id, node, (0,), SPEC, serving=task)


def test_a_serving_task_loads_its_model_runs_and_the_next_one_evicts_it() -> None:
    w, heard = world(per_s=1000.0, host_to_gpu_mb_per_ms=10.0)  # ms; an 80 GB GPU
    w.send(serving("w/a", "m1"))
    w.send(serving("w/b", "m2"))
    w.send(serving("w/c", "m3"))  # three 30 GB models do not fit: m1 goes
    run(w, heard)
    kinds = [(type(e).__name__, e.at) for e in heard]
    # a: load 3000 ms, run 100; b: load from 3100, run from 6100; c evicts m1 at 6200.
    assert kinds[:4] == [
        ("ModelLoaded", 3.0),
        ("TaskStarted", 3.0),
        ("TaskEnded", 3.1),
        ("ModelLoaded", 6.1),
    ]
    evicted = [e for e in heard if isinstance(e, ModelEvicted)]
    assert [(e.model, e.at) for e in evicted] == [("m1", 6.2)]
    assert [s.begun.loaded for s in w.served] == [True, True, True]
    assert w.ended == {"w/a": 3100.0, "w/b": 6200.0, "w/c": 9300.0}
    assert isinstance(heard[-1], TaskEnded) and heard[-1].at == 9.3


def test_a_gpu_refuses_a_task_it_would_keep_waiting_past_its_limit() -> None:
    w, heard = world(per_s=1000.0, host_to_gpu_mb_per_ms=10.0)
    w.send(serving("w/a", "m1"))  # 3,000 ms of load and 100 of run ahead of the next
    late = serving("w/b", "m1")
    assert late.serving is not None
    w.send(
        dataclasses.replace(late, serving=dataclasses.replace(late.serving, wait_limit_ms=3000.0))
    )
    [refused] = heard
    assert refused == TaskRefused(0.0, "w", "w/b", "n0", 0, 3100.0)
    assert "w/b" not in w.tasks and w.refused == 1
    assert not w.workers[("n0", 0)].queue  # it never queued
    w.send(
        dataclasses.replace(late, serving=dataclasses.replace(late.serving, wait_limit_ms=3100.0))
    )
    assert w.refused == 1 and "w/b" in w.tasks  # within its limit: queued


def test_a_batch_task_on_a_caching_gpu_evicts_its_models_first() -> None:
    w, heard = world(per_s=1000.0, host_to_gpu_mb_per_ms=10.0)
    w.send(serving("w/a", "m1"))
    run(w, heard)
    heard.clear()
    w.start(place("j/0"))
    run(w, heard)
    assert [type(e) for e in heard] == [ModelEvicted, TaskStarted]
    assert w.evicted_by_batch == 1
    assert isinstance(heard[0], ModelEvicted) and heard[0].model == "m1"
    with pytest.raises(SimulationError, match="which batch holds"):
        w.send(serving("w/b", "m2"))
        run(w, heard)


def test_charges_follow_starts_and_ends_at_the_node_price() -> None:
    w, heard = world()
    w.prices["n0"] = 2.0
    usage = WindowedUsage(3600.0)
    w.start(place("j/0", gpus=(0, 1)))
    run(w, heard)
    for event in heard:
        w.charge(usage, event)
    w.now = 100.0
    w.end("j/0")
    w.charge(usage, heard[-1])
    assert usage.snapshot(100.0)["a"].allocated_gpu_s == pytest.approx(2 * 100 * 2.0)
