"""Workflow (serving) tasks: a queue and a model cache per GPU, tasks run one at a time.

Each GPU with serving tasks has a pure ``GpuWorker`` (its model cache and queue) and a
loop here that runs its tasks one at a time, in the worker's order, once their inputs
have arrived (``input_delay`` after the placement is read); GPUs run side by side.
A task whose placement carries a ``wait_limit`` is refused instead (``TaskRefused``,
nothing queued) when the work ahead of it on its GPU would keep it waiting longer:
placement sends it elsewhere. Otherwise a serving task reports, in this order::

    ModelEvicted*  (each model the worker chose to make room, with why)
    ModelLoaded    (only on a cache miss, once the model is on the GPU)
    TaskStarted    (after the load: the task runs from here)
    TaskFinished | TaskFailed

The simulated executor waits ``model_mb / host_to_gpu_mb_per_ms`` for a load, then
``run_duration``. A process loads its model itself as it starts: ModelLoaded then comes
just before its launch and its ``load_duration`` is the agent's estimate; the books of what
is cached stay the agent's. A batch task placed on a GPU whose cache holds models
evicts them all (ModelEvicted, "GPU taken by batch job ...") before its TaskStarted.
A serving task stopped while queued or loading fails as a stopped running task does
(TaskFailed, exit code -15, the stop's reason), without a TaskStarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from qm.v1 import events_pb2, types_pb2

from libs.core import PolicyConfig
from libs.core.compass import CacheModel, GpuWorker, Start
from libs.core.compass.workflow import BYTES_PER_MB
from libs.events.convert import serving_from_proto
from services.node_agent.launch import LaunchError
from services.node_agent.lifecycle import (
    launch_failed,
    model_evicted,
    model_loaded,
    refused,
    stopped_before_start,
)
from services.node_agent.reports import Reporter
from services.node_agent.running import Executors, RunningTasks

log = logging.getLogger(__name__)

# Host-to-GPU copy rate for model loads (MB per ms): the planner's estimate by default.
DEFAULT_HOST_TO_GPU_MB_PER_MS = PolicyConfig().host_to_gpu_mb_per_ms


def gpu_memory_mb(node: types_pb2.NodeInventory, index: int) -> float:
    """The model cache of GPU ``index``: its whole memory, in MB (0 if unknown)."""
    return next((gpu.memory_bytes for gpu in node.gpus if gpu.index == index), 0) / BYTES_PER_MB


@dataclass
class _Gpu:
    """One GPU's serving side: the pure worker, and the loop here that drives it."""

    node: types_pb2.NodeInventory
    index: int
    worker: GpuWorker
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None


@dataclass
class _Pending:
    """A serving task not running yet: queued on its GPU, loading its model, launching."""

    gpu: _Gpu
    task: events_pb2.TaskPlaced
    placed_event_id: str
    span: Span
    loading: asyncio.Future[None] | None = None
    stopped_because: str = ""
    stop_event_id: str = ""


class ServingQueues:
    """The serving queues of the GPUs that have had serving tasks. Once launched, a
    serving task runs among ``runs`` until it ends; its GPU's next task waits for it."""

    def __init__(
        self,
        runs: RunningTasks,
        executors: Executors,
        report: Reporter,
        host_to_gpu_mb_per_ms: float = DEFAULT_HOST_TO_GPU_MB_PER_MS,
        cache_model: CacheModel = CacheModel.LOOKAHEAD,
    ) -> None:
        if host_to_gpu_mb_per_ms <= 0:
            raise ValueError("host_to_gpu_mb_per_ms must be > 0")
        self._cache_model = cache_model
        self._runs = runs
        self._executors = executors
        self._report = report
        self._host_to_gpu_mb_per_ms = host_to_gpu_mb_per_ms
        self._gpus: dict[tuple[str, int], _Gpu] = {}
        self._pending: dict[str, _Pending] = {}
        self._closing = False

    async def enqueue(
        self,
        node: types_pb2.NodeInventory,
        task: events_pb2.TaskPlaced,
        placed_event_id: str,
        span: Span,
    ) -> None:
        """Queue the task on its GPU; report it failed if it names other than one GPU."""
        if len(task.gpu_indices) != 1:
            error = LaunchError(
                f"a workflow task runs on exactly one GPU, got {len(task.gpu_indices)}", 126
            )
            log.warning("task %s could not start: %s", task.task_id, error.reason)
            with trace.use_span(span, end_on_exit=True):
                span.set_status(Status(StatusCode.ERROR, error.reason))
                await self._report(node, launch_failed(task, error), task, placed_event_id)
            self._runs.forget_later(task.task_id)
            return
        gpu = self._gpu(node, task.gpu_indices[0])
        served = serving_from_proto(task.serving)
        now = _now_ms()
        wait = gpu.worker.refuses(served, now)
        if wait is not None:
            log.info(
                "task %s refused on %s GPU %d: %.0f ms of work ahead of it, %.0f ms allowed",
                task.task_id,
                node.node_id,
                gpu.index,
                wait,
                served.wait_limit_ms,
            )
            with trace.use_span(span, end_on_exit=True):
                await self._report(node, refused(task, gpu.index, wait), task, placed_event_id)
            self._runs.refused(task.task_id, placed_event_id)
            return
        ready_ms = now + max(served.input_delay_ms, 0.0)
        gpu.worker.enqueue(task.task_id, served, ready_ms)
        self._pending[task.task_id] = _Pending(gpu, task, placed_event_id, span)
        log.info(
            "task %s queued on %s GPU %d (model %s)",
            task.task_id,
            node.node_id,
            gpu.index,
            task.serving.model or "none",
        )
        gpu.wake.set()

    async def evict_for_batch(
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

    async def stop(self, task_id: str, reason: str, event_id: str) -> bool:
        """Stop the serving task if it is not running yet; False if it is not here."""
        item = self._pending.get(task_id)
        if item is None:
            return False
        await self._stop(item, reason, event_id)
        return True

    async def stop_on(self, node_id: str, reason: str, event_id: str) -> None:
        """Stop every serving task of the node that is not running yet."""
        for item in list(self._pending.values()):
            if item.gpu.node.node_id == node_id:
                await self._stop(item, reason, event_id)

    def any_on(self, node_id: str) -> bool:
        """Whether a serving task of the node is on its way to running."""
        return any(item.gpu.node.node_id == node_id for item in self._pending.values())

    async def close(self, reason: str) -> list[asyncio.Task[None]]:
        """Stop every task not running yet and let each GPU's loop end once its queue
        is empty; return the loops, for the caller to wait for."""
        self._closing = True
        for item in list(self._pending.values()):
            await self._stop(item, reason, item.placed_event_id)
        drivers = [gpu.driver for gpu in self._gpus.values() if gpu.driver is not None]
        for gpu in self._gpus.values():
            gpu.wake.set()  # an idle loop with nothing queued then ends
        return drivers

    def _gpu(self, node: types_pb2.NodeInventory, index: int) -> _Gpu:
        key = (node.node_id, index)
        gpu = self._gpus.get(key)
        if gpu is None:
            capacity = gpu_memory_mb(node, index)
            if capacity <= 0:
                log.warning("%s GPU %d: memory unknown, every model load evicts", *key)
            worker = GpuWorker(capacity, self._host_to_gpu_mb_per_ms, cache_model=self._cache_model)
            gpu = self._gpus[key] = _Gpu(node, index, worker)
            gpu.driver = asyncio.create_task(self._drive(gpu), name=f"{node.node_id}/gpu{index}")
        return gpu

    async def _drive(self, gpu: _Gpu) -> None:
        """Run the GPU's serving tasks one at a time, in the worker's order, until closed."""
        while True:
            now = _now_ms()
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
        item = self._pending[begun.task_id]
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
            run = await self._runs.launch(
                node, task, item.placed_event_id, item.span, model_resident=not begun.loaded
            )
        finally:
            self._pending.pop(task.task_id, None)
        if run is None:
            return
        if item.stopped_because:  # stopped while it was launching
            self._runs.request_stop(run, item.stopped_because, item.stop_event_id)
        await self._runs.await_exit(run)

    async def _load(self, item: _Pending, load_ms: float) -> bool:
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

    async def _stop(self, item: _Pending, reason: str, event_id: str) -> None:
        """Stop a serving task that is not running yet, wherever it is on its way."""
        if item.stopped_because:
            return  # already stopping; the first reason stands
        item.stopped_because, item.stop_event_id = reason, event_id
        log.info("stopping task %s: %s", item.task.task_id, reason)
        if item.gpu.worker.remove(item.task.task_id) is not None:  # still queued
            del self._pending[item.task.task_id]
            await self._fail_unstarted(item)
        elif item.loading is not None:
            item.loading.cancel()
        # Otherwise it is between steps or launching: _serve sees the reason and acts.

    async def _fail_unstarted(self, item: _Pending) -> None:
        task = item.task
        with trace.use_span(item.span, end_on_exit=True):
            item.span.set_status(Status(StatusCode.ERROR, item.stopped_because))
            payload = stopped_before_start(task, item.stopped_because)
            await self._report(item.gpu.node, payload, task, item.stop_event_id)
        self._runs.forget_later(task.task_id)


def _now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000
