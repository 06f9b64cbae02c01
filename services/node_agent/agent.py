"""The node agents of one process: act on placement decisions, report task lifecycles.

``NodeAgent`` knows no Kafka: it reads ``Delivery`` values and reports through an
injected ``emit``. ``serve`` is the Kafka shell around it.

Batch tasks start as soon as they are placed and run side by side (``running.py``).
Workflow tasks (``TaskPlaced.serving``) go to their GPU's serving queue
(``serving.py``). The nodes are registered, and kept alive by heartbeats, in
``registration.py``; every report goes out through ``reports.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from opentelemetry.trace import Tracer
from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery, EventConsumer
from libs.core.compass import CacheModel
from libs.events.wire_time import seconds
from libs.trust.keys import parse_node_key_id
from services.node_agent.checkpoints import POLL_S, saved_at, warning_of
from services.node_agent.executors import ProcessExecution, ProcessExecutor
from services.node_agent.idle import IdleDetector, IdleThresholds, task_utilization
from services.node_agent.lifecycle import checkpointed, decision_for, idle_changed, stop_reason
from services.node_agent.orphans import TaskRecord, TaskRecords
from services.node_agent.registration import DEFAULT_HEARTBEAT_S, Registrations
from services.node_agent.reports import Emit, Reporter
from services.node_agent.running import REMEMBER_ENDED, Executors, RunningTasks
from services.node_agent.serving import DEFAULT_HOST_TO_GPU_MB_PER_MS, ServingQueues
from services.node_agent.utilization import Sampler, SamplingError

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "node agent stopped"
LOST_REASON = "placement declared this node lost"
DEFAULT_SAMPLE_S = 10.0
START_RETRY_S = 1.0  # between tries to reach the broker as the agent starts
# Refusals that mean placement does not trust the node's key (yet, or any more).
UNTRUSTED = frozenset({"unapproved_node", "revoked_key"})


class NodeAgent:
    """Runs the tasks placed on its nodes and reports how each one starts and ends.

    With ``samplers`` (node id -> sampler) it also reports when a task's GPUs go idle
    or busy again, sampling every ``sample_s`` seconds once ``watch_utilization`` runs
    (batch tasks only: a serving task is over long before a window is).
    ``host_to_gpu_mb_per_ms`` sets how long a model load takes, ``cache_model`` how each
    GPU's model cache makes room (placement must count on the same). Every ``heartbeat_s``
    seconds (0: never) ``heartbeat`` says each node is alive. ``log_endpoint``: where
    the agent serves its tasks' logs, told with each registration.
    """

    def __init__(
        self,
        nodes: Sequence[types_pb2.NodeInventory],
        *,
        executors: Executors,
        emit: Emit,
        tracer: Tracer | None = None,
        samplers: Mapping[str, Sampler] | None = None,
        idle: IdleThresholds | None = None,
        sample_s: float = DEFAULT_SAMPLE_S,
        remember_ended: int = REMEMBER_ENDED,
        host_to_gpu_mb_per_ms: float = DEFAULT_HOST_TO_GPU_MB_PER_MS,
        cache_model: CacheModel = CacheModel.LOOKAHEAD,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        log_endpoint: str = "",
        records: TaskRecords | None = None,
        incarnations: Mapping[str, str] | None = None,
        keep_tasks: bool = False,
    ) -> None:
        """``records``: where the running tasks and the nodes' incarnations are kept for
        the next agent (``orphans.py``), which registers with ``incarnations``;
        ``keep_tasks``: at shutdown, leave the tasks keepers run to their keepers, for the
        next agent to take back, instead of stopping them."""
        self._report = Reporter(emit)
        self._records = records
        self._keep_tasks = keep_tasks
        self._executors = executors
        self._runs = RunningTasks(executors, self._report, remember_ended)
        self._serving = ServingQueues(
            self._runs, executors, self._report, host_to_gpu_mb_per_ms, cache_model
        )
        self._registrations = Registrations(
            nodes,
            self._report,
            heartbeat_s,
            log_endpoint,
            cache_model.value,
            incarnations,
            None if records is None else records.keep_incarnations,
        )
        self._tracer = tracer or trace.get_tracer(__name__)
        self._samplers = dict(samplers or {})
        thresholds = idle or IdleThresholds()
        self._detectors = {node_id: IdleDetector(thresholds) for node_id in self._samplers}
        self._sample_s = sample_s
        # Work the agent started in the background: shutdown waits for each to end.
        self._waiters: set[asyncio.Task[None]] = set()

    def runs_task(self, task_id: str) -> bool:
        """Whether the task runs (or is starting) here."""
        return self._runs.runs_task(task_id)

    async def register(self) -> None:
        await self._registrations.register_all()

    async def heartbeat(self) -> None:
        """Say every ``heartbeat_s`` that each node is alive, until cancelled."""
        await self._registrations.heartbeat()

    async def handle(self, delivery: Delivery) -> bool:
        """Act on one decision record; False when it concerns none of these nodes.

        Returns once the record is acted upon: a placed task has started (or its failure
        to start is reported) or, a serving task, is queued on its GPU; a stop has been
        sent (or a queued serving task dropped and reported failed).
        """
        env = delivery.envelope
        if env.input_refused.trust in UNTRUSTED:
            node = parse_node_key_id(env.input_refused.subject)
            if node is not None and node[0] in self._registrations.nodes:
                self._registrations.untrusted(node[0], env.input_refused.reason)
                return True
        decision = decision_for(env, self._registrations.incarnations)
        if isinstance(decision, events_pb2.TaskPlaced):
            await self._start(decision, delivery)
        elif isinstance(decision, events_pb2.TaskStopRequested):
            await self._stop(decision, delivery.envelope.event_id)
        elif isinstance(decision, events_pb2.NodeLost):
            # In the background: the tasks' grace periods must not hold up other decisions.
            self._in_background(self._rejoin(decision, delivery.envelope.event_id))
        return decision is not None

    async def _rejoin(self, lost: events_pb2.NodeLost, event_id: str) -> None:
        """Placement gave this node up (it heard no heartbeat, say while the agent was
        cut off) and counted its tasks as lost: stop them, and once they have ended
        (their GPUs free for whatever placement puts there next) register anew."""
        node_id = lost.node_id
        log.warning("node %s declared lost (%s): stopping its tasks", node_id, lost.reason)
        await self._serving.stop_on(node_id, LOST_REASON, event_id)
        for run in self._runs.on(node_id):
            self._runs.request_stop(
                run, LOST_REASON, event_id, cause=types_pb2.STOP_CAUSE_NODE_LOST
            )
        while self._runs.on(node_id) or self._serving.any_on(node_id):
            await asyncio.sleep(0.1)
        await self._registrations.register_anew(node_id)

    async def take_back(self, records: Iterable[TaskRecord], executor: ProcessExecutor) -> None:
        """Follow the tasks an earlier agent left to their keepers (``orphans.adopt``):
        each reports its end as if started here (at once, if it ended meanwhile)."""
        for record in records:
            task = record.task
            node = self._registrations.nodes[task.node_id]
            execution = await executor.adopt(record)
            span = self._tracer.start_span(
                "run task", attributes={"qm.job_id": task.job_id, "qm.task_id": task.task_id}
            )
            run = self._runs.adopt(node, task, execution, span)
            log.info("took back task %s on %s (pid %d)", task.task_id, node.node_id, execution.pid)
            self._in_background(self._runs.await_exit(run), name=task.task_id)

    async def shutdown(self) -> None:
        """Stop every running or queued task (``keep_tasks``: but those their keepers
        run, left for the next agent), wait until each has reported how it ended, then
        for what the executors do in the background."""
        self._report.closing = True
        drivers = await self._serving.close(SHUTDOWN_REASON)
        left: set[str] = set()
        for run in self._runs.all():
            if self._keep_tasks and isinstance(run.execution, ProcessExecution):
                left.add(run.task.task_id)
                continue
            self._runs.request_stop(run, SHUTDOWN_REASON, run.placed_event_id)
        for waiter in self._waiters:
            if waiter.get_name() in left:
                waiter.cancel()
        if left:
            log.info("left %d tasks running to their keepers: %s", len(left), sorted(left))
        # Failures are logged by _waiter_done; one must not keep the others from ending.
        await asyncio.gather(*self._waiters, *drivers, return_exceptions=True)
        for executor in self._executors.values():
            await executor.close()

    async def _start(self, task: events_pb2.TaskPlaced, delivery: Delivery) -> None:
        placed_event_id = delivery.envelope.event_id
        if not self._runs.claim(task.task_id, placed_event_id):
            log.info(
                "task %s already started or refused here; ignoring the redelivery", task.task_id
            )
            return
        node = self._registrations.nodes[task.node_id]
        if task.HasField("serving") and self._records is not None:
            self._records.mark_serving(node.node_id)
        # One span for the whole run, child of the decision's consumer span: ended once
        # the task has.
        span = self._tracer.start_span(
            "run task",
            context=delivery.context,
            attributes={
                "qm.job_id": task.job_id,
                "qm.task_id": task.task_id,
                "qm.node_id": task.node_id,
                "qm.gpu_indices": list(task.gpu_indices),
            },
        )
        if task.HasField("serving"):
            await self._serving.enqueue(node, task, placed_event_id, span)
            return
        with trace.use_span(span):
            await self._serving.evict_for_batch(node, task, placed_event_id)
        run = await self._runs.launch(node, task, placed_event_id, span)
        if run is None:
            return
        self._in_background(self._runs.await_exit(run), name=task.task_id)

    async def _stop(self, request: events_pb2.TaskStopRequested, event_id: str) -> None:
        run = self._runs.get(request.task_id)
        if run is not None:
            # A decision may shorten the grace (free work); 0 leaves the agent's own.
            self._runs.request_stop(
                run,
                stop_reason(request),
                event_id,
                seconds(request.grace),
                request.cause,
                warning_of(request),
            )
        elif not await self._serving.stop(request.task_id, stop_reason(request), event_id):
            log.info("stop for task %s, which is not running here: nothing to do", request.task_id)

    def _in_background(self, work: Coroutine[Any, Any, None], name: str | None = None) -> None:
        waiter = asyncio.create_task(work, name=name)
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiter_done)

    def _waiter_done(self, waiter: asyncio.Task[None]) -> None:
        self._waiters.discard(waiter)
        if not waiter.cancelled() and waiter.exception() is not None:
            log.error(
                "could not report how task %s ended", waiter.get_name(), exc_info=waiter.exception()
            )

    async def watch_utilization(self) -> None:
        """Sample the nodes every ``sample_s`` seconds until cancelled."""
        while True:
            try:
                await self.sample_utilization()
            except Exception:
                # One failed round (a send that failed, say) must not end idle detection.
                log.exception("GPU utilisation round failed")
            await asyncio.sleep(self._sample_s)

    async def watch_checkpoints(self) -> None:
        """Report each checkpoint a task says it saved, looking every ``POLL_S``."""
        while True:
            for run in self._runs.all():
                path = run.execution.saved
                at = saved_at(path) if path is not None else None
                if at is None or at <= run.checkpointed_at:
                    continue
                run.checkpointed_at = at
                log.info("task %s saved a checkpoint", run.task.task_id)
                try:
                    with trace.use_span(run.span):
                        await self._report(
                            run.node, checkpointed(run.task), run.task, run.placed_event_id
                        )
                except Exception:
                    log.exception("cannot report task %s's checkpoint", run.task.task_id)
            await asyncio.sleep(POLL_S)

    async def sample_utilization(self) -> None:
        """Sample each node once; report the tasks whose GPUs went idle or busy again."""
        for node_id, sampler in self._samplers.items():
            # A task being stopped is on its way out: its GPUs going quiet is no news.
            runs = {
                run.task.task_id: run
                for run in self._runs.on(node_id)
                if run.stopper is None and not run.task.HasField("serving")
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


async def serve(agent: NodeAgent, consumer: EventConsumer, stop: asyncio.Event) -> None:
    """Register the nodes, act on decisions and watch GPU utilisation until ``stop`` is
    set, then stop the tasks.

    Offsets are committed once a poll's records are all acted upon: a restarted
    agent never misses a placement, and one redelivered for a task it took back
    (``take_back``) is not run twice. Serving tasks still queued at a crash are lost
    with it (their node registers anew). Heartbeats start at once: a restarted agent's
    nodes that kept their incarnation stay alive while it rejoins its consumer group.
    """
    beating = asyncio.ensure_future(agent.heartbeat())
    if not await _started(consumer, stop):
        beating.cancel()
        await agent.shutdown()  # the tasks it took back stay with their keepers
        return
    watcher: asyncio.Future[Any] | None = None
    try:
        if not await _until_assigned(consumer, stop):
            return
        await agent.register()
        watcher = asyncio.gather(agent.watch_utilization(), agent.watch_checkpoints())
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
        for running in (beating, watcher):
            if running is not None:
                running.cancel()
                await asyncio.wait({running})
        try:
            await consumer.stop()
        finally:
            await agent.shutdown()


async def _started(consumer: EventConsumer, stop: asyncio.Event) -> bool:
    """Start reading decisions, trying again while the broker cannot be reached (an
    agent may start while it is down: its tasks run on meanwhile); False if told to
    stop first."""
    while True:
        try:
            await consumer.start()
            return True
        except KafkaConnectionError as exc:
            log.warning("decisions not readable yet, trying again: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), START_RETRY_S)
            return False


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
