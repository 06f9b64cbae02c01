"""The agent's surroundings in memory: the producer it reports to, the decisions it reads,
the executors it runs tasks on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery
from libs.config.sandbox import CheckpointsEntry, SandboxFile, ScratchEntry
from libs.events import event_type, new_envelope
from services.node_agent.executors import ProcessExecutor, SimulatedExecutor
from services.node_agent.running import Executors
from services.node_agent.sandbox import Sandbox
from services.node_agent.tasklogs import TaskLogs

# The trace of each decision, and the span that consumed it (the agent's Kafka consumer).
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CONSUMER_SPAN_ID = "b7ad6b7169203331"


class Recorder:
    """Stands in for the producer: keeps each envelope and the span it was sent under."""

    def __init__(self) -> None:
        self.events: list[events_pb2.Envelope] = []
        self.spans: list[SpanContext] = []

    async def __call__(self, env: events_pb2.Envelope) -> None:
        self.events.append(env)
        self.spans.append(trace.get_current_span().get_span_context())

    def types(self) -> list[str]:
        return [event_type(env) for env in self.events]

    def of(self, kind: str) -> list[events_pb2.Envelope]:
        return [env for env in self.events if event_type(env) == kind]

    def trail(self) -> list[tuple[str, str]]:
        """(event type, task or model) for each event, for readable order checks."""
        out = []
        for env in self.events:
            kind = event_type(env)
            body = getattr(env, kind)
            out.append((kind, body.model if kind.startswith("model_") else body.task_id))
        return out

    async def trail_after(self, finished: int) -> list[tuple[str, str]]:
        """The trail once ``finished`` tasks have finished."""
        await self.until(finished, "task_finished")
        return self.trail()

    async def until(self, count: int, kind: str | None = None) -> None:
        """Wait until ``count`` events (of ``kind``, if given) have been sent."""
        async with asyncio.timeout(5):
            while len(self.of(kind) if kind else self.events) < count:
                await asyncio.sleep(0.005)


def delivery(payload: Message, offset: int = 0) -> Delivery:
    """A decision as the agent reads it, under its consumer span in placement's trace."""
    consumed = SpanContext(
        int(TRACE_ID, 16), int(CONSUMER_SPAN_ID, 16), is_remote=False, trace_flags=TraceFlags(1)
    )
    return Delivery(
        envelope=new_envelope(payload, producer="placement", cluster="west"),
        topic="decisions",
        partition=0,
        offset=offset,
        context=trace.set_span_in_context(NonRecordingSpan(consumed)),
    )


# The executors a test made: closed once it ends (``close_executors``).
_made: list[ProcessExecutor] = []


def process_executor(folder: Path, *, checkpoints: bool = False, **options: Any) -> ProcessExecutor:
    """Tasks run as the agent: their logs in ``folder/logs``, their jobs' scratch folders
    in ``folder/scratch`` (and, with ``checkpoints``, checkpoint folders in
    ``folder/checkpoints``)."""
    config = SandboxFile(
        scratch=ScratchEntry(root=str(folder / "scratch")),
        checkpoints=CheckpointsEntry(root=str(folder / "checkpoints")) if checkpoints else None,
    )
    sandbox = Sandbox(config, os.environ, switch=False)
    executor = ProcessExecutor(TaskLogs(folder / "logs"), sandbox=sandbox, **options)
    _made.append(executor)
    return executor


async def close_executors() -> None:
    """Finish what the executors made since the last call do in the background (a
    folder's removal): a child process still starting as the loop closes hangs it."""
    while _made:
        await _made.pop().close()


def task_log(folder: Path, job_id: str = "job-1", task_id: str = "job-1/0") -> Path:
    """Where ``process_executor(folder)`` keeps a task's log."""
    return TaskLogs(folder / "logs").path(job_id, task_id)


def executors(folder: Path) -> Executors:
    """Real processes (``process_executor(folder)``, a second's grace) and simulated ones."""
    return {
        types_pb2.EXECUTOR_PROCESS: process_executor(folder, grace_s=1),
        types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor(),
    }
