"""Admission reads a job's output from the node agents that ran it (``qm logs``).

Each agent tells where it serves its logs when it registers a node (``NodeRegistered
.log_endpoint``, kept in the projector's node view). Admission calls it as
``svc-log-reader``, an identity of its own that the projector does not accept: a
registration that names a rogue endpoint learns a token good for agents' logs only,
and only for minutes.

Every task keeps a log of its own: each attempt, each part of a gang, each workflow
task. Admission asks the agents which tasks of the job they kept (``ListTaskLogs``),
orders them (attempt, then part) and reads each (``ReadTaskLog``). The agents it asks
are those of every node a task of the job was placed on, by any attempt
(``Job.placed_on``) or as a workflow's task (``Job.tasks``), unless lost. Following, it
asks again every ``LIST_EVERY_S`` (a requeued job's next attempt, a gang's part that
starts late) and reads the running tasks side by side, until the job has ended (or the
attempt asked for has) and every task's log has been read to its end.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc
from qm.v1 import logs_pb2, logs_pb2_grpc, types_pb2

from libs.config.env import address
from libs.core.ids import attempt_of, gang_rank, is_batch_task_id
from libs.readmodels import has_ended
from services.grpc_server import bearer
from services.status import Unavailable
from services.tls import TlsSettings, aio_channel

READER = "svc-log-reader"
# Channels to agents kept open; the least recently used one closes past this many.
KEEP_CHANNELS = 64
# How often following asks the agents for tasks it has not seen yet.
LIST_EVERY_S = 1.0
# Pieces of running tasks' output read ahead of the caller.
READ_AHEAD = 64


class NoOutput(Exception):
    """There is no output of the job to read; the message says why, for its user."""


@dataclass(frozen=True)
class TaskOutput:
    """A task whose log an agent keeps."""

    task_id: str
    node_id: str
    endpoint: str  # the agent's
    started: float  # seconds since the epoch
    running: bool  # as the agent last said: its log may grow
    attempt: int  # counted from 1; 0 for a workflow's task
    part: int  # counted from 1 in a gang; 0 when the attempt ran as one task


def task_output(job_id: str, endpoint: str, entry: logs_pb2.TaskLogEntry) -> TaskOutput:
    """An agent's entry, numbered for people: placement 0 is attempt 1, rank 0 part 1."""
    attempt = part = 0
    if is_batch_task_id(job_id, entry.task_id):
        attempt = attempt_of(entry.task_id) + 1
        rank = gang_rank(entry.task_id)
        part = 0 if rank is None else rank + 1
    return TaskOutput(
        task_id=entry.task_id,
        node_id=entry.node_id,
        endpoint=endpoint,
        started=entry.started_at.ToNanoseconds() / 1e9,
        running=entry.running,
        attempt=attempt,
        part=part,
    )


def in_order(tasks: Iterable[TaskOutput]) -> list[TaskOutput]:
    """By attempt, then part; a workflow's tasks as they started."""
    return sorted(tasks, key=lambda t: (t.attempt, t.part, t.started, t.task_id))


def job_nodes(job: types_pb2.Job) -> list[str]:
    """The nodes the job's tasks ran on: every attempt's, its latest placement's first
    (or its workflow's tasks')."""
    nodes = [p.node_id for p in job.placements] or ([job.node_id] if job.node_id else [])
    nodes += [*job.placed_on, *(task.node_id for task in job.tasks if task.node_id)]
    return list(dict.fromkeys(nodes))


def log_sources(nodes: Iterable[str], known: Iterable[types_pb2.Node]) -> list[str]:
    """The agents' endpoints for ``nodes``, each once (an agent may host several); a node
    whose agent serves no logs (or is unknown) has none."""
    endpoints = {n.inventory.node_id: n.log_endpoint for n in known if n.log_endpoint}
    return list(dict.fromkeys(endpoints[node] for node in nodes if node in endpoints))


def sources(job: types_pb2.Job, known: Iterable[types_pb2.Node]) -> list[str]:
    """The agents to ask for the job's tasks: those of every node a task of it ran on
    that is not lost."""
    return log_sources(job_nodes(job), [n for n in known if not n.lost])


def unreadable(job: types_pb2.Job, known: Iterable[types_pb2.Node]) -> str | None:
    """Why no agent can be asked for the job's output, or None: it never started, its
    nodes were lost, or their agents serve no logs."""
    nodes = job_nodes(job)
    if not nodes:
        state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        never = "never ran" if has_ended(job) else "has not started yet"
        return f"job {job.job_id} {never} ({state}: {job.reason or 'no reason given'})" + (
            "" if has_ended(job) else "; qm logs -f waits for it"
        )
    known = list(known)
    if sources(job, known):
        return None
    lost = sorted({n.inventory.node_id for n in known if n.lost} & set(nodes))
    if lost:
        return (
            f"the output of job {job.job_id} is on node(s) {', '.join(lost)}, which were "
            "lost: their agents do not answer (it is back once they register again)"
        )
    return (
        f"no output of job {job.job_id} is kept: its nodes ({', '.join(nodes)}) "
        "serve no task logs (simulated nodes run nothing)"
    )


def no_output(job: types_pb2.Job, known: Iterable[types_pb2.Node], attempt: int) -> str:
    """Why the agents that were asked keep no output of the job (of ``attempt``, if not 0)."""
    if attempt > job.attempts:
        return f"job {job.job_id} has no attempt {attempt}: it has been placed {job.attempts} times"
    nodes = job_nodes(job)
    simulated = {
        n.inventory.node_id for n in known if n.inventory.executor == types_pb2.EXECUTOR_SIMULATED
    }
    if nodes and set(nodes) <= simulated:
        return (
            f"job {job.job_id} has no output: it ran on simulated node(s) {', '.join(nodes)}, "
            "which run no command"
        )
    which = f"attempt {attempt} of job {job.job_id}" if attempt else f"job {job.job_id}"
    if has_ended(job):  # a task that started wrote its header at least: it is gone
        return f"no output of {which} is kept: the agents of {', '.join(nodes)} have no log of it"
    state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
    return f"{which} has no output yet ({state}); qm logs -f waits for it"


class TaskLogReader:
    """Reads tasks' logs from the agents; ``token`` gives a current ``svc-log-reader``
    token; ``tls``: how to reach agents (verifying them against the installation's CA),
    ``tls_name`` the name their certificates carry, if not the address dialled."""

    def __init__(
        self, token: Callable[[], str], tls: TlsSettings, tls_name: str | None = None
    ) -> None:
        self._token = token
        self._tls = tls
        self._options = [("grpc.ssl_target_name_override", tls_name)] if tls_name else None
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()

    async def tasks(self, endpoint: str, job_id: str) -> list[TaskOutput]:
        """The job's tasks whose logs the agent at ``endpoint`` keeps."""
        stub = logs_pb2_grpc.NodeLogServiceStub(await self._channel(endpoint))
        try:
            reply = await stub.ListTaskLogs(
                logs_pb2.ListTaskLogsRequest(job_id=job_id),
                metadata=bearer(self._token()),
                timeout=30,
            )
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"the node agent at {endpoint}: {exc.details()}") from exc
        return [task_output(job_id, endpoint, entry) for entry in reply.tasks]

    async def read(self, task: TaskOutput, job_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        """The task's log; with ``follow``, until the task has ended."""
        stub = logs_pb2_grpc.NodeLogServiceStub(await self._channel(task.endpoint))
        call = stub.ReadTaskLog(
            logs_pb2.ReadTaskLogRequest(job_id=job_id, task_id=task.task_id, follow=follow),
            metadata=bearer(self._token()),
        )
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"the node agent at {task.endpoint}: {exc.details()}") from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _channel(self, endpoint: str) -> grpc.aio.Channel:
        try:
            address(endpoint)  # the log says it: nothing but HOST:PORT is dialled
        except ValueError as exc:
            raise Unavailable(f"a node agent registered a bad log endpoint: {exc}") from None
        channel = self._channels.pop(endpoint, None) or aio_channel(
            endpoint, self._tls, self._options
        )
        self._channels[endpoint] = channel
        while len(self._channels) > KEEP_CHANNELS:
            _, oldest = self._channels.popitem(last=False)
            await oldest.close()
        return channel


Nodes = Callable[[types_pb2.Job], Awaitable[list[types_pb2.Node]]]
Lookup = Callable[[str], Awaitable[types_pb2.Job | None]]
Piece = tuple[TaskOutput, bytes]


async def job_output(
    reader: TaskLogReader,
    job: types_pb2.Job,
    *,
    nodes: Nodes,
    lookup: Lookup,
    attempt: int = 0,
    follow: bool = False,
    every_s: float = LIST_EVERY_S,
) -> AsyncIterator[Piece]:
    """The job's output (``attempt``'s only, if not 0), task by task in order, each piece
    with its task; ``NoOutput`` if there is none. ``nodes`` gives the job's cluster's
    nodes, ``lookup`` the job as it is now (following)."""
    known = await nodes(job)
    why = unreadable(job, known)
    if why is not None:
        raise NoOutput(why)
    tasks = await _listed(reader, job, known, attempt)
    if not follow:
        if not tasks:
            raise NoOutput(no_output(job, known, attempt))
        for task in tasks:
            async for data in reader.read(task, job.job_id, follow=False):
                yield task, data
        return
    async for piece in _follow(reader, job, tasks, nodes, lookup, attempt, every_s):
        yield piece


async def _listed(
    reader: TaskLogReader, job: types_pb2.Job, known: list[types_pb2.Node], attempt: int
) -> list[TaskOutput]:
    found = await asyncio.gather(*(reader.tasks(e, job.job_id) for e in sources(job, known)))
    return in_order(t for tasks in found for t in tasks if attempt in (0, t.attempt))


async def _follow(
    reader: TaskLogReader,
    job: types_pb2.Job,
    tasks: list[TaskOutput],
    nodes: Nodes,
    lookup: Lookup,
    attempt: int,
    every_s: float,
) -> AsyncIterator[Piece]:
    """Tasks that have ended come whole, in order; running ones side by side, as they
    write. Each round asks the agents again, until nothing is left to read."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[Piece | TaskOutput | BaseException] = asyncio.Queue(READ_AHEAD)
    readers: dict[str, asyncio.Task[None]] = {}
    seen: set[str] = set()
    try:
        while True:
            new = [t for t in tasks if t.task_id not in seen]
            seen.update(t.task_id for t in new)
            for task in new:
                if task.running:
                    readers[task.task_id] = asyncio.create_task(
                        _pump(reader, task, job.job_id, pieces)
                    )
                    continue
                async for data in reader.read(task, job.job_id, follow=False):
                    yield task, data
            # Over once the job (or the attempt asked for) has ended, all of it read.
            over = has_ended(job) or 0 < attempt < job.attempts
            if over and not new and not readers:
                if not seen:
                    raise NoOutput(no_output(job, await nodes(job), attempt))
                return
            deadline = loop.time() + every_s
            while (left := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(pieces.get(), left)
                except TimeoutError:
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, TaskOutput):
                    del readers[item.task_id]
                else:
                    yield item
            job = await lookup(job.job_id) or job
            tasks = await _listed(reader, job, await nodes(job), attempt)
    finally:
        for running in readers.values():
            running.cancel()
        await asyncio.gather(*readers.values(), return_exceptions=True)


async def _pump(
    reader: TaskLogReader,
    task: TaskOutput,
    job_id: str,
    pieces: asyncio.Queue[Piece | TaskOutput | BaseException],
) -> None:
    """Follow one task's log into ``pieces``; the task itself once it is read to its end
    (or the error that stopped it)."""
    try:
        async for data in reader.read(task, job_id, follow=True):
            await pieces.put((task, data))
    except Exception as exc:
        await pieces.put(exc)
        return
    await pieces.put(task)
