"""Tasks running on the agent's nodes: launched on their executor, reported started,
watched until they end and reported ended; stopped on request. Also which tasks were
started here, and which placements a GPU here refused, so that a redelivered placement
does not run twice."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from qm.v1 import events_pb2, types_pb2

from services.node_agent.checkpoints import StopWarning
from services.node_agent.executors import Execution, Executor
from services.node_agent.launch import LaunchError
from services.node_agent.lifecycle import ended, launch_failed, started
from services.node_agent.reports import Reporter
from services.node_agent.scratch import may_return

log = logging.getLogger(__name__)

Executors = Mapping[types_pb2.Executor.ValueType, Executor]

# Redeliveries come soon after the original placement: older ended tasks need not be known.
REMEMBER_ENDED = 10_000


@dataclass
class Run:
    """A running task; its span ends when the task does."""

    node: types_pb2.NodeInventory
    task: events_pb2.TaskPlaced
    placed_event_id: str
    execution: Execution
    span: Span
    stopped_because: str = ""
    stop_event_id: str = ""
    stop_cause: types_pb2.StopCause.ValueType = types_pb2.STOP_CAUSE_UNSPECIFIED
    stopper: asyncio.Task[None] | None = None
    checkpointed_at: float = 0.0  # the last save reported (its file's mtime)


class RunningTasks:
    """The tasks running on the agent's nodes, by task id, and those started lately."""

    def __init__(
        self, executors: Executors, report: Reporter, remember_ended: int = REMEMBER_ENDED
    ) -> None:
        self._executors = executors
        self._report = report
        self._runs: dict[str, Run] = {}
        self._launching: set[str] = set()  # tasks between their claim and their run
        # Tasks started here and not long ended; _ended says which to forget first.
        self._started: set[str] = set()
        self._ended: deque[str] = deque()
        self._remember_ended = remember_ended
        # Placements (event ids) of workflow tasks a GPU here refused, lately.
        self._refused: set[str] = set()
        self._refused_order: deque[str] = deque()

    def claim(self, task_id: str, placed_event_id: str) -> bool:
        """Note that the task starts here; False if it already has, or if this placement
        was refused here (a redelivery either way)."""
        if task_id in self._started or placed_event_id in self._refused:
            return False
        self._started.add(task_id)
        return True

    def refused(self, task_id: str, placed_event_id: str) -> None:
        """A GPU here refused the task: a new placement of it may start here, this one
        never (its redelivery is ignored)."""
        self._started.discard(task_id)
        self._refused.add(placed_event_id)
        self._refused_order.append(placed_event_id)
        if len(self._refused_order) > self._remember_ended:
            self._refused.discard(self._refused_order.popleft())

    def forget_later(self, task_id: str) -> None:
        """The task has ended: it may be forgotten once enough others have."""
        self._ended.append(task_id)
        if len(self._ended) > self._remember_ended:
            self._started.discard(self._ended.popleft())

    def get(self, task_id: str) -> Run | None:
        return self._runs.get(task_id)

    def on(self, node_id: str) -> list[Run]:
        """The tasks running on the node."""
        return [run for run in self._runs.values() if run.node.node_id == node_id]

    def all(self) -> list[Run]:
        return list(self._runs.values())

    def runs_task(self, task_id: str) -> bool:
        """Whether the task runs here, or is starting (its output may still grow)."""
        return task_id in self._runs or task_id in self._launching

    async def launch(
        self,
        node: types_pb2.NodeInventory,
        task: events_pb2.TaskPlaced,
        placed_event_id: str,
        span: Span,
        *,
        model_resident: bool = False,
    ) -> Run | None:
        """Start the task and report it started; None (its failure reported) if it cannot."""
        with trace.use_span(span):
            self._launching.add(task.task_id)
            try:
                try:
                    execution = await self._executors[node.executor].start(
                        task, model_resident=model_resident, address=node.address
                    )
                except LaunchError as exc:
                    log.warning("task %s could not start: %s", task.task_id, exc.reason)
                    span.set_status(Status(StatusCode.ERROR, exc.reason))
                    await self._report(node, launch_failed(task, exc), task, placed_event_id)
                    span.end()
                    self.forget_later(task.task_id)
                    return None
                await self._report(node, started(task, execution.pid), task, placed_event_id)
                log.info(
                    "task %s started on %s GPUs %s", task.task_id, node.node_id, task.gpu_indices
                )
                run = Run(node, task, placed_event_id, execution, span)
                self._runs[task.task_id] = run
            finally:
                self._launching.discard(task.task_id)
        return run

    def adopt(
        self,
        node: types_pb2.NodeInventory,
        task: events_pb2.TaskPlaced,
        execution: Execution,
        span: Span,
    ) -> Run:
        """Follow a task an earlier agent started (``orphans.adopt``) as if started here."""
        self._started.add(task.task_id)
        run = Run(node, task, "", execution, span)
        self._runs[task.task_id] = run
        return run

    async def await_exit(self, run: Run) -> None:
        """Wait for the task to end and report how it did. Cancelled (the agent stops and
        leaves the task to its keeper), nothing is reported or let go of."""
        left = False
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
        except asyncio.CancelledError:
            left = True
            raise
        finally:
            del self._runs[run.task.task_id]
            if not left:
                self.forget_later(run.task.task_id)
                stopped = bool(run.stopped_because)
                run.execution.cleanup(may_return(run.task, stopped, run.stop_cause))

    def request_stop(
        self,
        run: Run,
        reason: str,
        event_id: str,
        grace_s: float = 0.0,
        cause: types_pb2.StopCause.ValueType = types_pb2.STOP_CAUSE_UNSPECIFIED,
        warning: StopWarning | None = None,
    ) -> None:
        """``grace_s``: SIGKILL after at most this long (0: the executor's grace);
        ``cause``: why, as placement said (whether the job may come back here);
        ``warning``: a signal first, that long before SIGTERM."""
        if run.stopper is not None:
            return  # already stopping; the first reason stands
        run.stopped_because, run.stop_event_id, run.stop_cause = reason, event_id, cause
        log.info("stopping task %s: %s", run.task.task_id, reason)
        # In the background: one task's grace period must not hold up other decisions.
        run.stopper = asyncio.create_task(run.execution.stop(grace_s, warning))
