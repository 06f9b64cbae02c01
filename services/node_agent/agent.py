"""The node agents of one process: act on placement decisions, report task lifecycles.

``NodeAgent`` knows no Kafka: it reads ``Delivery`` values and reports through an
injected ``emit``. ``serve`` is the Kafka shell around it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka.structs import TopicPartition
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery, EventConsumer
from libs.events import new_envelope
from services.node_agent.executors import Execution, Executor, LaunchError
from services.node_agent.idle import IdleDetector, IdleThresholds, task_utilization
from services.node_agent.lifecycle import (
    decision_for,
    ended,
    idle_changed,
    launch_failed,
    producer_name,
    started,
    stop_reason,
)
from services.node_agent.utilization import Sampler, SamplingError

log = logging.getLogger(__name__)

Emit = Callable[[events_pb2.Envelope], Awaitable[None]]

SHUTDOWN_REASON = "node agent stopped"
# Redeliveries come soon after the original placement: older ended tasks need not be known.
REMEMBER_ENDED = 10_000
DEFAULT_SAMPLE_S = 10.0


@dataclass
class _Running:
    node: types_pb2.NodeInventory
    task: events_pb2.TaskPlaced
    placed_event_id: str
    execution: Execution
    span: Span
    stopped_because: str = ""
    stop_event_id: str = ""
    stopper: asyncio.Task[None] | None = None


class NodeAgent:
    """Runs the tasks placed on its nodes and reports how each one starts and ends.

    With ``samplers`` (node id -> sampler) it also reports when a task's GPUs go idle
    or busy again, sampling every ``sample_s`` seconds once ``watch_utilization`` runs.
    """

    def __init__(
        self,
        nodes: Sequence[types_pb2.NodeInventory],
        *,
        executors: Mapping[types_pb2.Executor.ValueType, Executor],
        emit: Emit,
        tracer: Tracer | None = None,
        samplers: Mapping[str, Sampler] | None = None,
        idle: IdleThresholds | None = None,
        sample_s: float = DEFAULT_SAMPLE_S,
        remember_ended: int = REMEMBER_ENDED,
    ) -> None:
        self._nodes = {node.node_id: node for node in nodes}
        self._executors = executors
        self._emit = emit
        self._tracer = tracer or trace.get_tracer(__name__)
        # Tasks started here and not long ended, so that a redelivered placement does not
        # run twice; _ended says which to forget first.
        self._started: set[str] = set()
        self._ended: deque[str] = deque()
        self._remember_ended = remember_ended
        self._running: dict[str, _Running] = {}
        self._samplers = dict(samplers or {})
        thresholds = idle or IdleThresholds()
        self._detectors = {node_id: IdleDetector(thresholds) for node_id in self._samplers}
        self._sample_s = sample_s
        self._waiters: set[asyncio.Task[None]] = set()

    async def register(self) -> None:
        for node in self._nodes.values():
            await self._report(node, events_pb2.NodeRegistered(inventory=node))
            log.info("registered node %s: %d GPUs", node.node_id, len(node.gpus))

    async def handle(self, delivery: Delivery) -> bool:
        """Act on one decision record; False when it concerns none of these nodes.

        Returns once the record is acted upon: a placed task has started (or its failure
        to start is reported), a stop has been sent.
        """
        decision = decision_for(delivery.envelope, self._nodes)
        if isinstance(decision, events_pb2.TaskPlaced):
            await self._start(decision, delivery)
        elif isinstance(decision, events_pb2.TaskStopRequested):
            self._stop(decision, delivery.envelope.event_id)
        return decision is not None

    async def shutdown(self) -> None:
        """Stop every running task and wait until each has reported how it ended."""
        for run in list(self._running.values()):
            self._request_stop(run, SHUTDOWN_REASON, run.placed_event_id)
        # Failures are logged by _waiter_done; one must not keep the others from ending.
        await asyncio.gather(*self._waiters, return_exceptions=True)

    async def _start(self, task: events_pb2.TaskPlaced, delivery: Delivery) -> None:
        if task.task_id in self._started:
            log.info("task %s already started here; ignoring the redelivery", task.task_id)
            return
        self._started.add(task.task_id)
        node = self._nodes[task.node_id]
        placed_event_id = delivery.envelope.event_id
        # One span for the whole run, child of placement's: ended by _await_exit.
        span = self._tracer.start_span(
            "run task",
            context=delivery.context,
            kind=SpanKind.CONSUMER,
            attributes={
                "qm.job_id": task.job_id,
                "qm.task_id": task.task_id,
                "qm.node_id": task.node_id,
                "qm.gpu_indices": list(task.gpu_indices),
            },
        )
        with trace.use_span(span):
            try:
                execution = await self._executors[node.executor].start(task)
            except LaunchError as exc:
                log.warning("task %s could not start: %s", task.task_id, exc.reason)
                span.set_status(Status(StatusCode.ERROR, exc.reason))
                await self._report(node, launch_failed(task, exc), task, placed_event_id)
                span.end()
                self._forget_later(task.task_id)
                return
            await self._report(node, started(task, execution.pid), task, placed_event_id)
        log.info("task %s started on %s GPUs %s", task.task_id, node.node_id, task.gpu_indices)
        run = _Running(node, task, placed_event_id, execution, span)
        self._running[task.task_id] = run
        waiter = asyncio.create_task(self._await_exit(run), name=task.task_id)
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiter_done)

    async def _await_exit(self, run: _Running) -> None:
        try:
            with trace.use_span(run.span, end_on_exit=True):
                exit_code = await run.execution.wait()
                outcome = ended(run.task, exit_code, run.stopped_because)
                if isinstance(outcome, events_pb2.TaskFailed):
                    run.span.set_status(Status(StatusCode.ERROR, outcome.reason))
                # A stopped task ended because of the stop request, not of its placement.
                cause = run.stop_event_id or run.placed_event_id
                await self._report(run.node, outcome, run.task, cause)
                log.info("task %s ended: exit code %d", run.task.task_id, exit_code)
        finally:
            del self._running[run.task.task_id]
            self._forget_later(run.task.task_id)

    def _forget_later(self, task_id: str) -> None:
        self._ended.append(task_id)
        if len(self._ended) > self._remember_ended:
            self._started.discard(self._ended.popleft())

    def _waiter_done(self, waiter: asyncio.Task[None]) -> None:
        self._waiters.discard(waiter)
        if not waiter.cancelled() and waiter.exception() is not None:
            log.error(
                "could not report how task %s ended", waiter.get_name(), exc_info=waiter.exception()
            )

    def _stop(self, request: events_pb2.TaskStopRequested, event_id: str) -> None:
        run = self._running.get(request.task_id)
        if run is None:
            log.info("stop for task %s, which is not running here: nothing to do", request.task_id)
            return
        self._request_stop(run, stop_reason(request), event_id)

    def _request_stop(self, run: _Running, reason: str, event_id: str) -> None:
        if run.stopper is not None:
            return  # already stopping; the first reason stands
        run.stopped_because, run.stop_event_id = reason, event_id
        log.info("stopping task %s: %s", run.task.task_id, reason)
        # In the background: one task's grace period must not hold up other decisions.
        run.stopper = asyncio.create_task(run.execution.stop())

    async def watch_utilization(self) -> None:
        """Sample the nodes every ``sample_s`` seconds until cancelled."""
        while True:
            try:
                await self.sample_utilization()
            except Exception:
                # One failed round (a send that failed, say) must not end idle detection.
                log.exception("GPU utilisation round failed")
            await asyncio.sleep(self._sample_s)

    async def sample_utilization(self) -> None:
        """Sample each node once; report the tasks whose GPUs went idle or busy again."""
        for node_id, sampler in self._samplers.items():
            # A task being stopped is on its way out: its GPUs going quiet is no news.
            runs = {
                run.task.task_id: run
                for run in self._running.values()
                if run.node.node_id == node_id and run.stopper is None
            }
            try:
                sample = sampler.sample([run.task for run in runs.values()])
            except SamplingError as exc:
                log.warning("cannot sample GPU utilisation on %s: %s", node_id, exc)
                continue
            levels = {
                task_id: task_utilization(sample.by_gpu, run.task.gpu_indices)
                for task_id, run in runs.items()
            }
            for change in self._detectors[node_id].observe(sample.at, levels):
                run = runs[change.task_id]
                log.info(
                    "task %s is %s: GPU utilisation %.0f%%",
                    change.task_id,
                    "idle" if change.idle else "busy again",
                    change.utilization * 100,
                )
                payload = idle_changed(run.task, change.idle, change.utilization)
                with trace.use_span(run.span):
                    await self._report(run.node, payload, run.task, run.placed_event_id)

    async def _report(
        self,
        node: types_pb2.NodeInventory,
        payload: Message,
        task: events_pb2.TaskPlaced | None = None,
        cause: str = "",
    ) -> None:
        await self._emit(
            new_envelope(
                payload,
                producer=producer_name(node.node_id),
                cluster=node.cluster,
                correlation_id=task.job_id if task else "",
                causation_id=cause,
            )
        )


async def serve(agent: NodeAgent, consumer: EventConsumer, stop: asyncio.Event) -> None:
    """Register the nodes, act on decisions and watch GPU utilisation until ``stop`` is
    set, then stop the tasks.

    Offsets are committed once a poll's records are all acted upon: a restarted
    agent never misses a placement, and a crash mid-poll at worst re-runs the tasks
    it had just started (and lost with it), which the scheduler tolerates.
    """
    await consumer.start()
    watcher: asyncio.Task[None] | None = None
    try:
        if not await _until_assigned(consumer, stop):
            return
        await agent.register()
        watcher = asyncio.create_task(agent.watch_utilization())
        async for batch in consumer.batches():
            done: dict[TopicPartition, int] = {}
            for delivery in batch:
                await agent.handle(delivery)
                done[delivery.topic_partition] = delivery.offset + 1
            if done:
                await consumer.kafka.commit(done)
            if stop.is_set():
                return
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})
        try:
            await consumer.stop()
        finally:
            await agent.shutdown()


async def _until_assigned(consumer: EventConsumer, stop: asyncio.Event) -> bool:
    """Wait until the decisions are read from a known position; False if told to stop.

    Registering earlier could let a placement made for the new node slip by unseen.
    """
    while not consumer.kafka.assignment():
        if stop.is_set():
            return False
        await asyncio.sleep(0.1)
    for partition in consumer.kafka.assignment():
        await consumer.kafka.position(partition)
    return True
