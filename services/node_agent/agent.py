"""The node agents of one process: act on placement decisions, report task lifecycles.

``NodeAgent`` knows no Kafka: it reads ``Delivery`` values and reports through an
injected ``emit``. ``serve`` is the Kafka shell around it.

Batch tasks start as soon as they are placed and run side by side. Workflow tasks
(``TaskPlaced.serving``) go to their GPU's serving queue: each GPU with such tasks
has a pure ``GpuWorker`` (its model cache and queue) and a loop here that runs its
tasks one at a time, in the worker's order, once their inputs have arrived
(``input_delay_ms`` after the placement is read); GPUs run side by side. A serving
task reports, in this order::

    ModelEvicted*  (each model the worker chose to make room, with why)
    ModelLoaded    (only on a cache miss, once the model is on the GPU)
    TaskStarted    (after the load: the task runs from here)
    TaskFinished | TaskFailed

The simulated executor waits ``model_mb / host_to_gpu_mb_per_ms`` for a load, then
``run_ms``. A process loads its model itself as it starts: ModelLoaded then comes
just before its launch and its ``load_ms`` is the agent's estimate; the books of what
is cached stay the agent's. A batch task placed on a GPU whose cache holds models
evicts them all (ModelEvicted, "GPU taken by batch job ...") before its TaskStarted.
A serving task stopped while queued or loading fails as a stopped running task does
(TaskFailed, exit code -15, the stop's reason), without a TaskStarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery, EventConsumer
from libs.core import PolicyConfig
from libs.core.compass import GpuWorker, Start
from libs.core.compass.workflow import BYTES_PER_MB
from libs.events import event_type, new_envelope
from libs.events.convert import serving_from_proto
from services.node_agent.executors import Execution, Executor, LaunchError
from services.node_agent.idle import IdleDetector, IdleThresholds, task_utilization
from services.node_agent.lifecycle import (
    decision_for,
    ended,
    idle_changed,
    launch_failed,
    model_evicted,
    model_loaded,
    new_incarnation,
    producer_name,
    started,
    stop_reason,
    stopped_before_start,
)
from services.node_agent.utilization import Sampler, SamplingError

log = logging.getLogger(__name__)

Emit = Callable[[events_pb2.Envelope], Awaitable[None]]

SHUTDOWN_REASON = "node agent stopped"
LOST_REASON = "placement declared this node lost"
# Redeliveries come soon after the original placement: older ended tasks need not be known.
REMEMBER_ENDED = 10_000
DEFAULT_SAMPLE_S = 10.0
# Placement declares a node lost after node_lost_timeout_s (30 s by default) of silence.
DEFAULT_HEARTBEAT_S = 5.0
# A report that could not be sent (the broker is down) is tried again after this,
# doubling up to the most: no task end is dropped while the agent runs.
RETRY_FIRST_S = 0.5
RETRY_MOST_S = 10.0
# Host-to-GPU copy rate for model loads (MB per ms): the planner's estimate by default.
DEFAULT_HOST_TO_GPU_MB_PER_MS = PolicyConfig().host_to_gpu_mb_per_ms


def gpu_memory_mb(node: types_pb2.NodeInventory, index: int) -> float:
    """The model cache of GPU ``index``: its whole memory, in MB (0 if unknown)."""
    return next((gpu.memory_bytes for gpu in node.gpus if gpu.index == index), 0) / BYTES_PER_MB


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


@dataclass
class _Gpu:
    """One GPU's serving side: the pure worker, and the loop here that drives it."""

    node: types_pb2.NodeInventory
    index: int
    worker: GpuWorker
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None


@dataclass
class _Serving:
    """A serving task not running yet: queued on its GPU, loading its model, launching."""

    gpu: _Gpu
    task: events_pb2.TaskPlaced
    placed_event_id: str
    span: Span
    loading: asyncio.Future[None] | None = None
    stopped_because: str = ""
    stop_event_id: str = ""


class NodeAgent:
    """Runs the tasks placed on its nodes and reports how each one starts and ends.

    With ``samplers`` (node id -> sampler) it also reports when a task's GPUs go idle
    or busy again, sampling every ``sample_s`` seconds once ``watch_utilization`` runs
    (batch tasks only: a serving task is over long before a window is).
    ``host_to_gpu_mb_per_ms`` sets how long a model load takes. Every ``heartbeat_s``
    seconds (0: never) ``heartbeat`` says each node is alive.
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
        host_to_gpu_mb_per_ms: float = DEFAULT_HOST_TO_GPU_MB_PER_MS,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    ) -> None:
        if host_to_gpu_mb_per_ms <= 0:
            raise ValueError("host_to_gpu_mb_per_ms must be > 0")
        if heartbeat_s < 0:
            raise ValueError("heartbeat_s must be >= 0")
        self._nodes = {node.node_id: node for node in nodes}
        # Each registration of a node is a new incarnation: placement then knows that
        # the tasks of an earlier one are gone.
        self._incarnations = {node_id: new_incarnation() for node_id in self._nodes}
        self._heartbeat_s = heartbeat_s
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
        self._host_to_gpu_mb_per_ms = host_to_gpu_mb_per_ms
        self._gpus: dict[tuple[str, int], _Gpu] = {}  # GPUs that have had serving tasks
        self._serving: dict[str, _Serving] = {}
        self._closing = False

    async def register(self) -> None:
        for node in self._nodes.values():
            await self._register(node)

    async def _register(self, node: types_pb2.NodeInventory) -> None:
        incarnation = self._incarnations[node.node_id]
        registered = events_pb2.NodeRegistered(
            inventory=node, incarnation=incarnation, heartbeat_s=self._heartbeat_s
        )
        await self._report(node, registered)
        log.info("registered node %s (%s): %d GPUs", node.node_id, incarnation, len(node.gpus))

    async def heartbeat(self) -> None:
        """Say every ``heartbeat_s`` that each node is alive, until cancelled. A beat
        that cannot be sent is skipped: the next one says the same."""
        if not self._heartbeat_s:
            return
        while True:
            await asyncio.sleep(self._heartbeat_s)
            for node_id, node in self._nodes.items():
                beat = events_pb2.NodeHeartbeat(
                    node_id=node_id, incarnation=self._incarnations[node_id]
                )
                try:
                    await self._emit(self._envelope(node, beat))
                except Exception as exc:
                    log.warning("heartbeat of %s not sent: %s", node_id, exc)

    async def handle(self, delivery: Delivery) -> bool:
        """Act on one decision record; False when it concerns none of these nodes.

        Returns once the record is acted upon: a placed task has started (or its failure
        to start is reported) or, a serving task, is queued on its GPU; a stop has been
        sent (or a queued serving task dropped and reported failed).
        """
        decision = decision_for(delivery.envelope, self._incarnations)
        if isinstance(decision, events_pb2.TaskPlaced):
            await self._start(decision, delivery)
        elif isinstance(decision, events_pb2.TaskStopRequested):
            await self._stop(decision, delivery.envelope.event_id)
        elif isinstance(decision, events_pb2.NodeLost):
            # In the background: the tasks' grace periods must not hold up other decisions.
            rejoin = asyncio.create_task(self._rejoin(decision, delivery.envelope.event_id))
            self._waiters.add(rejoin)
            rejoin.add_done_callback(self._waiter_done)
        return decision is not None

    async def _rejoin(self, lost: events_pb2.NodeLost, event_id: str) -> None:
        """Placement gave this node up (it heard no heartbeat, say while the agent was
        cut off) and counted its tasks as lost: stop them, and once they have ended
        (their GPUs free for whatever placement puts there next) register anew."""
        node_id = lost.node_id
        log.warning("node %s declared lost (%s): stopping its tasks", node_id, lost.reason)
        for item in list(self._serving.values()):
            if item.gpu.node.node_id == node_id:
                await self._stop_serving(item, LOST_REASON, event_id)
        for run in list(self._running.values()):
            if run.node.node_id == node_id:
                self._request_stop(run, LOST_REASON, event_id)
        while any(r.node.node_id == node_id for r in self._running.values()) or any(
            i.gpu.node.node_id == node_id for i in self._serving.values()
        ):
            await asyncio.sleep(0.1)
        self._incarnations[node_id] = new_incarnation()
        await self._register(self._nodes[node_id])

    async def shutdown(self) -> None:
        """Stop every running or queued task and wait until each has reported how it ended."""
        self._closing = True
        for item in list(self._serving.values()):
            await self._stop_serving(item, SHUTDOWN_REASON, item.placed_event_id)
        for run in list(self._running.values()):
            self._request_stop(run, SHUTDOWN_REASON, run.placed_event_id)
        drivers = [gpu.driver for gpu in self._gpus.values() if gpu.driver is not None]
        for gpu in self._gpus.values():
            gpu.wake.set()  # an idle loop with nothing queued then ends
        # Failures are logged by _waiter_done; one must not keep the others from ending.
        await asyncio.gather(*self._waiters, *drivers, return_exceptions=True)

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
        if task.HasField("serving"):
            await self._enqueue(node, task, placed_event_id, span)
            return
        with trace.use_span(span):
            await self._evict_for_batch(node, task, placed_event_id)
        run = await self._launch(node, task, placed_event_id, span)
        if run is None:
            return
        waiter = asyncio.create_task(self._await_exit(run), name=task.task_id)
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiter_done)

    async def _launch(
        self,
        node: types_pb2.NodeInventory,
        task: events_pb2.TaskPlaced,
        placed_event_id: str,
        span: Span,
        *,
        model_resident: bool = False,
    ) -> _Running | None:
        """Start the task and report it started; None (its failure reported) if it cannot."""
        with trace.use_span(span):
            try:
                execution = await self._executors[node.executor].start(
                    task, model_resident=model_resident
                )
            except LaunchError as exc:
                log.warning("task %s could not start: %s", task.task_id, exc.reason)
                span.set_status(Status(StatusCode.ERROR, exc.reason))
                await self._report(node, launch_failed(task, exc), task, placed_event_id)
                span.end()
                self._forget_later(task.task_id)
                return None
            await self._report(node, started(task, execution.pid), task, placed_event_id)
        log.info("task %s started on %s GPUs %s", task.task_id, node.node_id, task.gpu_indices)
        run = _Running(node, task, placed_event_id, execution, span)
        self._running[task.task_id] = run
        return run

    async def _evict_for_batch(
        self, node: types_pb2.NodeInventory, task: events_pb2.TaskPlaced, placed_event_id: str
    ) -> None:
        """A batch task takes its GPUs whole: the models cached there go."""
        for index in task.gpu_indices:
            gpu = self._gpus.get((node.node_id, index))
            if gpu is None:
                continue
            for eviction in gpu.worker.evict_all(f"GPU taken by batch job {task.job_id}"):
                log.info("evicting %s from %s GPU %d", eviction.model, node.node_id, index)
                payload = model_evicted(node.node_id, index, eviction)
                await self._report(node, payload, task, placed_event_id)

    # -- serving tasks ---------------------------------------------------------

    async def _enqueue(
        self,
        node: types_pb2.NodeInventory,
        task: events_pb2.TaskPlaced,
        placed_event_id: str,
        span: Span,
    ) -> None:
        if len(task.gpu_indices) != 1:
            error = LaunchError(
                f"a workflow task runs on exactly one GPU, got {len(task.gpu_indices)}", 126
            )
            log.warning("task %s could not start: %s", task.task_id, error.reason)
            with trace.use_span(span, end_on_exit=True):
                span.set_status(Status(StatusCode.ERROR, error.reason))
                await self._report(node, launch_failed(task, error), task, placed_event_id)
            self._forget_later(task.task_id)
            return
        gpu = self._gpu(node, task.gpu_indices[0])
        ready_ms = self._now_ms() + max(task.serving.input_delay_ms, 0.0)
        gpu.worker.enqueue(task.task_id, serving_from_proto(task.serving), ready_ms)
        self._serving[task.task_id] = _Serving(gpu, task, placed_event_id, span)
        log.info(
            "task %s queued on %s GPU %d (model %s)",
            task.task_id,
            node.node_id,
            gpu.index,
            task.serving.model or "none",
        )
        gpu.wake.set()

    def _gpu(self, node: types_pb2.NodeInventory, index: int) -> _Gpu:
        key = (node.node_id, index)
        gpu = self._gpus.get(key)
        if gpu is None:
            capacity = gpu_memory_mb(node, index)
            if capacity <= 0:
                log.warning("%s GPU %d: memory unknown, every model load evicts", *key)
            worker = GpuWorker(capacity, self._host_to_gpu_mb_per_ms)
            gpu = self._gpus[key] = _Gpu(node, index, worker)
            gpu.driver = asyncio.create_task(self._drive(gpu), name=f"{node.node_id}/gpu{index}")
        return gpu

    @staticmethod
    def _now_ms() -> float:
        return asyncio.get_running_loop().time() * 1000

    async def _drive(self, gpu: _Gpu) -> None:
        """Run the GPU's serving tasks one at a time, in the worker's order, until shutdown."""
        while True:
            now = self._now_ms()
            begun = gpu.worker.start(now)
            if begun is None:
                if self._closing and not gpu.worker.queue:
                    return
                gpu.wake.clear()
                wake_at = gpu.worker.next_ready_ms()
                timeout = None if wake_at is None else max(wake_at - now, 0.0) / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gpu.wake.wait(), timeout)
                continue
            try:
                await self._serve(gpu, begun)
            except Exception:
                # One task's failed report must not stop the GPU's queue.
                log.exception("serving task %s failed", begun.task_id)
            finally:
                gpu.worker.finish(begun.task_id)

    async def _serve(self, gpu: _Gpu, begun: Start) -> None:
        """Make room, load the model if it is missing, run the task; report each step."""
        item = self._serving[begun.task_id]
        node, task = gpu.node, item.task
        model = begun.serving.model
        try:
            with trace.use_span(item.span):
                for eviction in begun.evicted:
                    log.info("evicting %s from %s GPU %d", eviction.model, node.node_id, gpu.index)
                    evicted = model_evicted(node.node_id, gpu.index, eviction)
                    await self._report(node, evicted, task, item.placed_event_id)
                in_cache = not begun.loaded
                if begun.loaded and not item.stopped_because:
                    if begun.oversized:
                        log.warning(
                            "model %s (%g MB) is larger than %s GPU %d: loading it alone",
                            model,
                            begun.serving.model_mb,
                            node.node_id,
                            gpu.index,
                        )
                    if await self._load(item, begun.load_ms):
                        in_cache = True
                        loaded = model_loaded(task, gpu.index, begun)
                        await self._report(node, loaded, task, item.placed_event_id)
                if not in_cache:
                    gpu.worker.forget(model)  # never got there
                if item.stopped_because:
                    await self._fail_unstarted(item)
                    return
            run = await self._launch(
                node, task, item.placed_event_id, item.span, model_resident=not begun.loaded
            )
        finally:
            self._serving.pop(task.task_id, None)
        if run is None:
            return
        if item.stopped_because:  # stopped while it was launching
            self._request_stop(run, item.stopped_because, item.stop_event_id)
        await self._await_exit(run)

    async def _load(self, item: _Serving, load_ms: float) -> bool:
        """Load the task's model; False if a stop interrupted the load."""
        executor = self._executors[item.gpu.node.executor]
        loading = item.loading = asyncio.ensure_future(executor.load_model(item.task, load_ms))
        try:
            await asyncio.wait({loading})
        finally:
            item.loading = None
        if loading.cancelled():
            return False
        loading.result()  # a load that failed raises here
        return True

    async def _stop_serving(self, item: _Serving, reason: str, event_id: str) -> None:
        """Stop a serving task that is not running yet, wherever it is on its way."""
        if item.stopped_because:
            return  # already stopping; the first reason stands
        item.stopped_because, item.stop_event_id = reason, event_id
        log.info("stopping task %s: %s", item.task.task_id, reason)
        if item.gpu.worker.remove(item.task.task_id) is not None:  # still queued
            del self._serving[item.task.task_id]
            await self._fail_unstarted(item)
        elif item.loading is not None:
            item.loading.cancel()
        # Otherwise it is between steps or launching: _serve sees the reason and acts.

    async def _fail_unstarted(self, item: _Serving) -> None:
        task = item.task
        with trace.use_span(item.span, end_on_exit=True):
            item.span.set_status(Status(StatusCode.ERROR, item.stopped_because))
            payload = stopped_before_start(task, item.stopped_because)
            await self._report(item.gpu.node, payload, task, item.stop_event_id)
        self._forget_later(task.task_id)

    # -- running tasks ---------------------------------------------------------

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

    async def _stop(self, request: events_pb2.TaskStopRequested, event_id: str) -> None:
        run = self._running.get(request.task_id)
        if run is not None:
            self._request_stop(run, stop_reason(request), event_id)
            return
        item = self._serving.get(request.task_id)
        if item is not None:
            await self._stop_serving(item, stop_reason(request), event_id)
            return
        log.info("stop for task %s, which is not running here: nothing to do", request.task_id)

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
                if run.node.node_id == node_id
                and run.stopper is None
                and not run.task.HasField("serving")
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
        """Send a report, trying again while the bus refuses it: a task end that never
        reaches placement would hold its GPUs until the node is declared lost. Once the
        agent is shutting down, a report gets a few tries only."""
        env = self._envelope(node, payload, task, cause)
        delay, tries = RETRY_FIRST_S, 0
        while True:
            try:
                await self._emit(env)
                return
            except Exception as exc:
                tries += 1
                if self._closing and tries >= 3:
                    raise
                log.warning("%s not sent (%s); again in %.1f s", event_type(env), exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST_S)

    @staticmethod
    def _envelope(
        node: types_pb2.NodeInventory,
        payload: Message,
        task: events_pb2.TaskPlaced | None = None,
        cause: str = "",
    ) -> events_pb2.Envelope:
        return new_envelope(
            payload,
            producer=producer_name(node.node_id),
            cluster=node.cluster,
            correlation_id=task.job_id if task else "",
            causation_id=cause,
        )


async def serve(agent: NodeAgent, consumer: EventConsumer, stop: asyncio.Event) -> None:
    """Register the nodes, act on decisions and watch GPU utilisation until ``stop`` is
    set, then stop the tasks.

    Offsets are committed once a poll's records are all acted upon: a restarted
    agent never misses a placement, and a crash mid-poll at worst re-runs the tasks
    it had just started (and lost with it), which the scheduler tolerates. Serving
    tasks still queued at a crash are lost with it, like the running ones.
    """
    await consumer.start()
    watcher: asyncio.Future[Any] | None = None
    try:
        if not await _until_assigned(consumer, stop):
            return
        await agent.register()
        watcher = asyncio.gather(agent.watch_utilization(), agent.heartbeat())
        async for batch in consumer.batches():
            done: dict[TopicPartition, int] = {}
            for delivery in batch:
                await agent.handle(delivery)
                done[delivery.topic_partition] = delivery.offset + 1
            if done:
                await consumer.client.commit(done)
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
    while not consumer.client.assignment():
        if stop.is_set():
            return False
        await asyncio.sleep(0.1)
    for partition in consumer.client.assignment():
        await consumer.client.position(partition)
    return True
