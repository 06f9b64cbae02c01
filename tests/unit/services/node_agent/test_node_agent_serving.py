"""Workflow (serving) tasks on the agent: a model cache and a queue per GPU."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import simulated
from libs.core.compass import CacheModel
from libs.events.wire_time import duration_ms, milliseconds
from services.node_agent.agent import NodeAgent
from services.node_agent.executors import SimulatedExecutor
from services.node_agent.serving import gpu_memory_mb
from tests.unit.services.node_agent.doubles import Recorder, delivery, executors, task_log

MB = 1_000_000
BW = 100.0  # MB per ms: a 1000 MB model loads in 10 ms


def node(node_id: str, executor: types_pb2.Executor.ValueType) -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(
        node_id=node_id,
        cluster="west",
        executor=executor,
        source="declared",
        gpus=[
            types_pb2.Gpu(index=i, uuid=f"GPU-{node_id}-{i}", type="T4", memory_bytes=3000 * MB)
            for i in range(2)
        ],
    )


NODES = [node("sim-0", types_pb2.EXECUTOR_SIMULATED), node("proc-0", types_pb2.EXECUTOR_PROCESS)]


@pytest.fixture
async def agent(tmp_path: Path, emitted: Recorder) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(NODES, executors=executors(tmp_path), emit=emitted, host_to_gpu_mb_per_ms=BW)
    yield agent
    async with asyncio.timeout(5):
        await agent.shutdown()


def serving(
    task: str,
    model: str,
    mb: float = 1000,
    *,
    gpu: int = 0,
    node_id: str = "sim-0",
    run_ms: float = 5,
    delay_ms: float = 0,
    upcoming: tuple[str, ...] = (),
    command: tuple[str, ...] = (),
) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="wf-1",
        task_id=f"wf-1/{task}",
        node_id=node_id,
        gpu_indices=[gpu],
        spec=types_pb2.JobSpec(command=command),
        serving=events_pb2.ServingTask(
            name=task,
            model=model,
            model_mb=mb,
            run_duration=duration_ms(run_ms),
            input_delay=duration_ms(delay_ms),
            upcoming=upcoming,
        ),
    )


def batch(job_id: str, gpus: tuple[int, ...], duration_s: float = 0.01) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id=job_id,
        task_id=f"{job_id}/0",
        node_id="sim-0",
        gpu_indices=gpus,
        spec=types_pb2.JobSpec(env={simulated.SECONDS: repr(duration_s)}),
    )


def stop(task_id: str, reason: str = "cancelled") -> events_pb2.TaskStopRequested:
    return events_pb2.TaskStopRequested(
        job_id="wf-1", task_id=task_id, node_id="sim-0", reason=reason
    )


def test_gpu_memory_is_the_cache_in_mb() -> None:
    assert gpu_memory_mb(NODES[0], 1) == 3000
    assert gpu_memory_mb(NODES[0], 7) == 0


async def test_same_model_twice_loads_once_and_the_second_is_a_hit(
    agent: NodeAgent, emitted: Recorder
) -> None:
    first = delivery(serving("a", "opt", 1000))
    await agent.handle(first)
    await agent.handle(delivery(serving("b", "opt", 1000)))
    assert await emitted.trail_after(2) == [
        ("model_loaded", "opt"),
        ("task_started", "wf-1/a"),
        ("task_finished", "wf-1/a"),
        ("task_started", "wf-1/b"),
        ("task_finished", "wf-1/b"),
    ]
    loaded = emitted.events[0]
    # What goes in a ModelLoaded is test_node_agent_lifecycle's: here, what the agent decides.
    report = loaded.model_loaded
    assert (report.node_id, report.gpu_index, milliseconds(report.load_duration)) == (
        "sim-0",
        0,
        10,
    )
    assert (loaded.producer, loaded.correlation_id, loaded.causation_id) == (
        "node-agent/sim-0",
        "wf-1",
        first.envelope.event_id,
    )


async def test_memory_pressure_evicts_by_look_ahead(agent: NodeAgent, emitted: Recorder) -> None:
    for name, model in (("a", "m1"), ("b", "m2"), ("c", "m3")):  # fills the 3000 MB
        await agent.handle(delivery(serving(name, model)))
    await emitted.until(3, "task_finished")
    assert [env.model_loaded.model for env in emitted.of("model_loaded")] == ["m1", "m2", "m3"]
    # m4 needs room for 1000 MB. m3 is needed by the task queued behind it, m1 and m2 are
    # planned next on this GPU, m1 sooner: m2 is needed furthest ahead and goes
    # (least-recently-used would have taken m1).
    await agent.handle(delivery(serving("d", "m4", upcoming=("m1", "m2"))))
    await agent.handle(delivery(serving("e", "m3")))
    await emitted.until(5, "task_finished")
    assert emitted.trail()[9:] == [
        ("model_evicted", "m2"),
        ("model_loaded", "m4"),
        ("task_started", "wf-1/d"),
        ("task_finished", "wf-1/d"),
        ("task_started", "wf-1/e"),  # a hit
        ("task_finished", "wf-1/e"),
    ]
    evicted = emitted.of("model_evicted")[0].model_evicted
    assert (evicted.node_id, evicted.gpu_index) == ("sim-0", 0)
    assert evicted.reason == "room for m4 (wf-1/d): next needed 3 tasks ahead, after those kept"


async def test_a_fifo_cost_agent_evicts_the_first_loaded_and_pays_for_it(
    tmp_path: Path, emitted: Recorder
) -> None:
    fifo = NodeAgent(
        NODES,
        executors=executors(tmp_path),
        emit=emitted,
        host_to_gpu_mb_per_ms=BW,
        cache_model=CacheModel.FIFO_COST,
    )
    try:
        await fifo.register()  # it says how its caches make room, for placement to check
        assert {env.node_registered.cache_model for env in emitted.events} == {"fifo-cost"}
        emitted.events.clear()
        for name, model in (("a", "m1"), ("b", "m2"), ("c", "m3"), ("again", "m1")):
            await fifo.handle(delivery(serving(name, model)))
        await emitted.until(4, "task_finished")
        # m1 was used last, and is needed next: look-ahead would keep it; FIFO evicts it
        # (loaded first), and the load of m4 waits for m1 to leave the GPU.
        await fifo.handle(delivery(serving("d", "m4", upcoming=("m1",))))
        await emitted.until(5, "task_finished")
        (evicted,) = emitted.of("model_evicted")
        assert evicted.model_evicted.model == "m1"
        assert evicted.model_evicted.reason.endswith("loaded before the models kept")
        loaded = emitted.of("model_loaded")[-1].model_loaded
        assert (loaded.model, milliseconds(loaded.load_duration)) == ("m4", 20)
    finally:
        async with asyncio.timeout(5):
            await fifo.shutdown()


async def test_a_model_not_needed_again_goes_first(agent: NodeAgent, emitted: Recorder) -> None:
    await agent.handle(delivery(serving("a", "old", 2500)))
    await agent.handle(delivery(serving("b", "new", 1000)))
    await emitted.until(2, "task_finished")
    (evicted,) = emitted.of("model_evicted")
    assert evicted.model_evicted.model == "old"
    assert evicted.model_evicted.reason.endswith("no queued or upcoming task needs it")


async def test_a_batch_task_on_a_cached_gpu_evicts_every_model(
    agent: NodeAgent, emitted: Recorder
) -> None:
    await agent.handle(delivery(serving("a", "m1", gpu=1)))
    await agent.handle(delivery(serving("b", "m2", gpu=1)))
    await agent.handle(delivery(serving("c", "m9", gpu=0)))
    await emitted.until(3, "task_finished")
    emitted.events.clear()
    placed = delivery(batch("train-7", (1,)))
    await agent.handle(placed)
    assert await emitted.trail_after(1) == [
        ("model_evicted", "m1"),
        ("model_evicted", "m2"),
        ("task_started", "train-7/0"),
        ("task_finished", "train-7/0"),
    ]
    first = emitted.events[0]
    assert first.model_evicted == events_pb2.ModelEvicted(
        node_id="sim-0", gpu_index=1, model="m1", reason="GPU taken by batch job train-7"
    )
    assert (first.correlation_id, first.causation_id) == ("train-7", placed.envelope.event_id)
    # GPU 0's cache is untouched; GPU 1 must load again.
    emitted.events.clear()
    await agent.handle(delivery(serving("d", "m9", gpu=0)))
    await agent.handle(delivery(serving("e", "m1", gpu=1)))
    await emitted.until(2, "task_finished")
    assert [env.model_loaded.model for env in emitted.of("model_loaded")] == ["m1"]


async def test_gpus_run_side_by_side_and_inputs_are_waited_for(
    agent: NodeAgent, emitted: Recorder
) -> None:
    # On GPU 0 the task with late inputs is queued first but runs second.
    await agent.handle(delivery(serving("late", "m1", delay_ms=100)))
    await agent.handle(delivery(serving("now", "m1")))
    await agent.handle(delivery(serving("other", "m2", gpu=1, run_ms=50)))
    await emitted.until(3, "task_finished")
    started = [env.task_started.task_id for env in emitted.of("task_started")]
    assert started.index("wf-1/now") < started.index("wf-1/late")
    # GPU 1's long task started before GPU 0's second one: they did not wait for each other.
    assert started.index("wf-1/other") < started.index("wf-1/late")


async def test_a_stop_removes_a_queued_task(agent: NodeAgent, emitted: Recorder) -> None:
    await agent.handle(delivery(serving("a", "m1", run_ms=100)))
    await agent.handle(delivery(serving("b", "m1")))
    await agent.handle(delivery(serving("c", "m1")))
    request = delivery(stop("wf-1/b", "job cancelled"))
    await agent.handle(request)
    await emitted.until(2, "task_finished")
    assert ("task_started", "wf-1/b") not in emitted.trail()
    (failed,) = emitted.of("task_failed")
    assert (failed.task_failed.task_id, failed.task_failed.exit_code) == ("wf-1/b", -15)
    assert failed.task_failed.reason == "stop requested: job cancelled"
    assert failed.causation_id == request.envelope.event_id
    assert [env.task_finished.task_id for env in emitted.of("task_finished")] == [
        "wf-1/a",
        "wf-1/c",
    ]


async def test_a_stop_interrupts_a_load_and_the_model_is_not_cached(emitted: Recorder) -> None:
    slow = NodeAgent(
        NODES,
        executors={types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor()},
        emit=emitted,
        host_to_gpu_mb_per_ms=10,
    )
    await slow.handle(delivery(serving("a", "huge", 2500, run_ms=1)))  # 250 ms to load
    await asyncio.sleep(0.01)
    await slow.handle(delivery(stop("wf-1/a")))
    await emitted.until(1, "task_failed")
    assert emitted.types() == ["task_failed"]
    assert emitted.events[0].task_failed.reason == "stop requested: cancelled"
    await slow.handle(delivery(serving("b", "huge", 2500, run_ms=1)))
    await emitted.until(1, "task_finished")
    assert emitted.types()[1:] == ["model_loaded", "task_started", "task_finished"]
    await slow.shutdown()


async def test_a_stop_ends_a_running_serving_task(agent: NodeAgent, emitted: Recorder) -> None:
    await agent.handle(delivery(serving("a", "m1", run_ms=60_000)))
    await emitted.until(1, "task_started")
    await agent.handle(delivery(stop("wf-1/a", "preempted")))
    await emitted.until(1, "task_failed")
    assert emitted.types() == ["model_loaded", "task_started", "task_failed"]
    assert emitted.events[-1].task_failed.exit_code == -15


async def test_shutdown_fails_queued_and_running_tasks(tmp_path: Path, emitted: Recorder) -> None:
    agent = NodeAgent(
        NODES, executors={types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor()}, emit=emitted
    )
    await agent.handle(delivery(serving("a", "m1", run_ms=60_000)))
    await agent.handle(delivery(serving("b", "m1")))
    await emitted.until(1, "task_started")
    async with asyncio.timeout(5):
        await agent.shutdown()
    failed = {env.task_failed.task_id: env.task_failed.reason for env in emitted.of("task_failed")}
    assert failed == {"wf-1/a": "node agent stopped", "wf-1/b": "node agent stopped"}


async def test_a_redelivered_serving_placement_is_queued_once(
    agent: NodeAgent, emitted: Recorder
) -> None:
    await agent.handle(delivery(serving("a", "m1")))
    await agent.handle(delivery(serving("a", "m1")))
    await emitted.until(1, "task_finished")
    await asyncio.sleep(0.02)
    assert emitted.types() == ["model_loaded", "task_started", "task_finished"]


async def test_a_task_that_would_wait_past_its_limit_is_refused_and_may_come_back(
    agent: NodeAgent, emitted: Recorder
) -> None:
    # 10 ms of load and 200 ms of run ahead on GPU 0: a task allowed 50 ms is refused.
    await agent.handle(delivery(serving("a", "m1", run_ms=200)))
    limited = serving("b", "m1")
    limited.serving.wait_limit.CopyFrom(duration_ms(50))
    refused = delivery(limited)
    await agent.handle(refused)
    [report] = emitted.of("task_refused")
    assert report.causation_id == refused.envelope.event_id
    got = report.task_refused
    assert (got.task_id, got.node_id, got.gpu_index) == ("wf-1/b", "sim-0", 0)
    assert 150 < milliseconds(got.wait) <= 210
    await agent.handle(refused)  # a redelivery of the refused placement: still refused
    # Placement sends it anew (here, back to the same GPU without a limit): it runs.
    await agent.handle(delivery(serving("b", "m1")))
    await emitted.until(2, "task_finished")
    assert [e.task_finished.task_id for e in emitted.of("task_finished")] == ["wf-1/a", "wf-1/b"]
    assert len(emitted.of("task_refused")) == 1


async def test_a_serving_task_needs_one_gpu(agent: NodeAgent, emitted: Recorder) -> None:
    placed = serving("a", "m1")
    placed.gpu_indices.append(1)
    await agent.handle(delivery(placed))
    assert emitted.types() == ["task_failed"]
    assert emitted.events[0].task_failed.exit_code == 126


async def test_a_process_learns_its_model_and_whether_it_is_cached(
    tmp_path: Path, agent: NodeAgent, emitted: Recorder
) -> None:
    show = (
        sys.executable,
        "-c",
        "import os; print(*(os.environ[k] for k in "
        "('QM_TASK', 'QM_MODEL', 'QM_MODEL_MB', 'QM_MODEL_RESIDENT')))",
    )
    for name in ("a", "b"):
        await agent.handle(delivery(serving(name, "opt", 5720, node_id="proc-0", command=show)))
    await emitted.until(2, "task_finished")
    assert emitted.types() == [
        "model_loaded",
        "task_started",
        "task_finished",
        "task_started",
        "task_finished",
    ]
    assert milliseconds(emitted.events[0].model_loaded.load_duration) == pytest.approx(
        57.2
    )  # the estimate
    printed = [task_log(tmp_path, "wf-1", f"wf-1/{name}").read_text() for name in "ab"]
    assert [text.splitlines()[1:] for text in printed] == [["a opt 5720 0"], ["b opt 5720 1"]]
