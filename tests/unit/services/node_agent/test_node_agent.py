"""The agent against an in-memory emit: what it reports, and under which trace."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from qm.v1 import events_pb2, types_pb2

from libs.core import simulated
from services.node_agent.agent import NodeAgent
from services.node_agent.idle import IdleThresholds
from services.node_agent.inventory import parse_inventory
from services.node_agent.utilization import DeclaredSampler, Sample, SamplingError
from tests.unit.services.node_agent.doubles import (
    CONSUMER_SPAN_ID,
    TRACE_ID,
    Recorder,
    delivery,
    executors,
    process_executor,
    task_log,
)

NODES = parse_inventory(
    yaml.safe_load(
        """
nodes:
  - {node_id: sim-0, cluster: west, gpu_type: H100, gpu_count: 2, gpu_memory_gib: 80,
     executor: simulated}
  - {node_id: proc-0, gpu_type: H100, gpu_count: 2, gpu_memory_gib: 80}
"""
    ),
    source="test",
)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider.get_tracer("test")


def make_agent(tmp_path: Path, emitted: Recorder, tracer: Tracer, **options: Any) -> NodeAgent:
    return NodeAgent(NODES, executors=executors(tmp_path), emit=emitted, tracer=tracer, **options)


@pytest.fixture
def agent(tmp_path: Path, emitted: Recorder, tracer: Tracer) -> NodeAgent:
    return make_agent(tmp_path, emitted, tracer)


def placement(
    node_id: str = "sim-0", *command: str, duration_s: float = 0.05
) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="job-1",
        task_id="job-1/0",
        node_id=node_id,
        gpu_indices=[1],
        spec=types_pb2.JobSpec(command=command, env={simulated.SECONDS: repr(duration_s)}),
    )


def stop_request(reason: str = "preempted") -> events_pb2.TaskStopRequested:
    return events_pb2.TaskStopRequested(
        job_id="job-1", task_id="job-1/0", node_id="sim-0", reason=reason
    )


async def test_registers_every_node_under_its_own_name(agent: NodeAgent, emitted: Recorder) -> None:
    await agent.register()
    assert [
        (env.node_registered.inventory.node_id, env.producer, env.cluster) for env in emitted.events
    ] == [("sim-0", "node-agent/sim-0", "west"), ("proc-0", "node-agent/proc-0", "default")]
    assert all(env.HasField("occurred_at") for env in emitted.events)


async def test_a_placed_task_starts_and_finishes_under_its_decisions_consumer_span(
    agent: NodeAgent, emitted: Recorder, spans: InMemorySpanExporter
) -> None:
    placed = delivery(placement())
    assert await agent.handle(placed)
    await emitted.until(2)
    assert emitted.types() == ["task_started", "task_finished"]
    for env in emitted.events:
        assert (env.correlation_id, env.causation_id) == ("job-1", placed.envelope.event_id)
        assert (env.producer, env.cluster) == ("node-agent/sim-0", "west")
    assert emitted.events[0].task_started.pid == 0
    assert emitted.events[1].task_finished.exit_code == 0
    await agent.shutdown()
    (run,) = spans.get_finished_spans()
    assert run.parent is not None
    assert (run.context.trace_id, run.parent.span_id) == (
        int(TRACE_ID, 16),
        int(CONSUMER_SPAN_ID, 16),
    )
    assert [span.span_id for span in emitted.spans] == [run.context.span_id] * 2


async def test_decisions_for_other_nodes_are_ignored(agent: NodeAgent, emitted: Recorder) -> None:
    assert not await agent.handle(delivery(placement("gpu-9")))
    assert not await agent.handle(delivery(events_pb2.JobPending(job_id="job-1")))
    assert emitted.events == []


async def test_a_redelivered_placement_does_not_run_twice(
    agent: NodeAgent, emitted: Recorder
) -> None:
    assert await agent.handle(delivery(placement(duration_s=60)))
    assert await agent.handle(delivery(placement(duration_s=60), offset=1))
    await agent.shutdown()
    assert emitted.types() == ["task_started", "task_failed"]


async def test_a_command_that_cannot_start_fails_with_the_reason(
    agent: NodeAgent, emitted: Recorder, spans: InMemorySpanExporter
) -> None:
    placed = delivery(placement("proc-0", "no-such-command-qm"))
    await agent.handle(placed)
    assert emitted.types() == ["task_failed"]
    failed = emitted.events[0].task_failed
    assert (failed.exit_code, failed.reason) == (127, "command not found: no-such-command-qm")
    assert emitted.events[0].causation_id == placed.envelope.event_id
    assert [span.name for span in spans.get_finished_spans()] == ["run task"]


async def test_a_stop_request_ends_the_task_as_failed(agent: NodeAgent, emitted: Recorder) -> None:
    await agent.handle(delivery(placement(duration_s=60)))
    stop = delivery(stop_request("preempted by job-2"), offset=1)
    assert await agent.handle(stop)
    await emitted.until(2)
    failed = emitted.events[1]
    assert (failed.task_failed.exit_code, failed.task_failed.reason) == (
        -15,
        "stop requested: preempted by job-2",
    )
    assert failed.causation_id == stop.envelope.event_id


async def test_a_stop_requests_grace_reaches_the_process(
    tmp_path: Path, emitted: Recorder, tracer: Tracer
) -> None:
    slow = {types_pb2.EXECUTOR_PROCESS: process_executor(tmp_path, grace_s=60)}
    agent = NodeAgent(NODES, executors=slow, emit=emitted, tracer=tracer)
    ignores_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    code = ignores_sigterm + "print('ready', flush=True); time.sleep(60)"
    await agent.handle(delivery(placement("proc-0", sys.executable, "-c", code)))
    log = task_log(tmp_path)
    while not log.exists() or "ready" not in log.read_text().splitlines():
        await asyncio.sleep(0.02)
    stop = stop_request()
    stop.node_id = "proc-0"
    stop.grace.FromMilliseconds(200)  # free work preempted: a short grace
    await agent.handle(delivery(stop, offset=1))
    await emitted.until(2)  # killed after 0.2 s, not the executor's 60
    assert emitted.events[1].task_failed.exit_code == -9


async def test_a_stop_for_a_task_not_running_here_changes_nothing(
    agent: NodeAgent, emitted: Recorder
) -> None:
    assert await agent.handle(delivery(stop_request()))
    assert emitted.events == []


async def test_shutdown_stops_running_processes(agent: NodeAgent, emitted: Recorder) -> None:
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    await agent.handle(delivery(placement("proc-0", *sleeper)))
    assert emitted.events[0].task_started.pid > 0
    async with asyncio.timeout(5):
        await agent.shutdown()
    assert emitted.types() == ["task_started", "task_failed"]
    failed = emitted.events[1].task_failed
    assert (failed.exit_code, failed.reason) == (-15, "node agent stopped")


async def test_a_task_ended_long_ago_is_forgotten_and_may_run_again(
    tmp_path: Path, emitted: Recorder, tracer: Tracer
) -> None:
    agent = make_agent(tmp_path, emitted, tracer, remember_ended=1)
    first = placement(duration_s=0)
    second = events_pb2.TaskPlaced()
    second.CopyFrom(first)
    second.job_id, second.task_id = "job-2", "job-2/0"
    await agent.handle(delivery(first))
    await emitted.until(2)
    await agent.handle(delivery(first, offset=1))  # just ended: still known
    assert len(emitted.events) == 2
    await agent.handle(delivery(second, offset=2))
    await emitted.until(4)
    await agent.handle(delivery(second, offset=3))
    await agent.handle(delivery(first, offset=4))  # pushed out by the second
    await emitted.until(6)
    assert emitted.types() == ["task_started", "task_finished"] * 3
    assert [env.correlation_id for env in emitted.events[::2]] == ["job-1", "job-2", "job-1"]


class ScriptedSampler:
    """GPU utilisation as the test sets it, a sample every 10 s."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.by_gpu = {0: 0.0, 1: 0.0}
        self.at = 0.0
        self.seen: list[list[str]] = []
        self.fail_next = fail_first

    def sample(self, tasks: Sequence[events_pb2.TaskPlaced]) -> Sample:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("sampler bug")
        self.seen.append([task.task_id for task in tasks])
        self.at += 10
        return Sample(self.at, dict(self.by_gpu))


class BrokenSampler:
    def sample(self, tasks: Sequence[events_pb2.TaskPlaced]) -> Sample:
        raise SamplingError("NVML: GPU is lost")


def idle_reports(emitted: Recorder) -> list[tuple[bool, float]]:
    return [(env.task_idle.idle, env.task_idle.utilization) for env in emitted.of("task_idle")]


async def test_an_idle_task_is_reported_once_inside_its_trace(
    tmp_path: Path, emitted: Recorder, tracer: Tracer
) -> None:
    clock = iter(range(0, 100, 10))
    sampler = DeclaredSampler(NODES[0], clock=lambda: float(next(clock)))
    agent = make_agent(
        tmp_path, emitted, tracer, samplers={"sim-0": sampler}, idle=IdleThresholds(window_s=20)
    )
    placed = delivery(placement(duration_s=60))  # declares no utilisation: 0
    await agent.handle(placed)
    for _ in range(4):
        await agent.sample_utilization()
    assert emitted.types() == ["task_started", "task_idle"]
    report = emitted.events[1]
    assert report.task_idle == events_pb2.TaskIdle(
        job_id="job-1", task_id="job-1/0", node_id="sim-0", idle=True, utilization=0.0
    )
    assert (report.producer, report.cluster, report.correlation_id, report.causation_id) == (
        "node-agent/sim-0",
        "west",
        "job-1",
        placed.envelope.event_id,
    )
    assert emitted.spans[1].span_id == emitted.spans[0].span_id
    await agent.shutdown()


async def test_a_task_busy_again_is_reported_and_a_stopping_one_is_not_sampled(
    tmp_path: Path, emitted: Recorder, tracer: Tracer
) -> None:
    sampler = ScriptedSampler()
    agent = make_agent(
        tmp_path, emitted, tracer, samplers={"sim-0": sampler}, idle=IdleThresholds(window_s=20)
    )
    await agent.handle(delivery(placement(duration_s=60)))
    for _ in range(3):
        await agent.sample_utilization()
    sampler.by_gpu[1] = 1.0  # the task's GPU
    await agent.sample_utilization()
    assert idle_reports(emitted) == [(True, 0.0), (False, 0.5)]
    await agent.handle(delivery(stop_request(), offset=1))
    await agent.sample_utilization()
    assert sampler.seen == [["job-1/0"]] * 4 + [[]]
    await agent.shutdown()


async def test_a_node_that_cannot_be_sampled_does_not_hold_up_the_others(
    tmp_path: Path, emitted: Recorder, tracer: Tracer, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = ScriptedSampler()
    agent = make_agent(
        tmp_path, emitted, tracer, samplers={"proc-0": BrokenSampler(), "sim-0": sampler}
    )
    await agent.sample_utilization()
    assert sampler.seen == [[]]
    assert "cannot sample GPU utilisation on proc-0: NVML: GPU is lost" in caplog.text


async def test_watching_samples_periodically_and_outlives_a_failed_round(
    tmp_path: Path, emitted: Recorder, tracer: Tracer, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = ScriptedSampler(fail_first=True)
    agent = make_agent(
        tmp_path,
        emitted,
        tracer,
        samplers={"sim-0": sampler},
        idle=IdleThresholds(window_s=10),
        sample_s=0.001,
    )
    await agent.handle(delivery(placement(duration_s=60)))
    watcher = asyncio.create_task(agent.watch_utilization())
    try:
        await emitted.until(2)
    finally:
        watcher.cancel()
    assert idle_reports(emitted) == [(True, 0.0)]
    assert "GPU utilisation round failed" in caplog.text
    await agent.shutdown()
