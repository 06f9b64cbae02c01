"""The agent's task logs, served to admission (``qm.v1.NodeLogService``), which checks
who may read a job's output; users never call an agent themselves."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable

import grpc
from pydantic import Field
from qm.v1 import logs_pb2, logs_pb2_grpc

from libs.auth import Keys
from libs.config.env import Address, EnvSettings, Names
from libs.core.ids import in_job
from libs.core.limits import MAX_NAME_CHARS
from services.authn import caller
from services.grpc_server import start_server
from services.node_agent.tasklogs import DEFAULT_MAX_BYTES, TaskLogs, read_log
from services.status import bounded

log = logging.getLogger(__name__)

# A task id: its job's id, a slash, and a placement number or a workflow task's id.
MAX_TASK_ID_CHARS = 2 * MAX_NAME_CHARS + 1


class LogSettings(EnvSettings):
    """``QM_NODE_LOG_ADDR``: where the agent serves its task logs (port 0 picks one;
    empty: serve none); ``QM_NODE_LOG_ENDPOINT``: the address admission reaches it at
    (default: this host and the bound port; in Kubernetes, the pod's IP);
    ``QM_NODE_LOG_CLIENTS``: the services that may read them; ``QM_TASK_LOG_MAX_BYTES``:
    a task's log rotates past this size (it keeps at most twice as much)."""

    address: Address | None = Field("127.0.0.1:0", alias="QM_NODE_LOG_ADDR")
    endpoint: Address | None = Field(None, alias="QM_NODE_LOG_ENDPOINT")
    clients: Names = Field(("svc-log-reader",), alias="QM_NODE_LOG_CLIENTS")
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=4096, alias="QM_TASK_LOG_MAX_BYTES")


async def serve_logs(
    settings: LogSettings, logs: TaskLogs, active: Callable[[str], bool], keys: Keys | None
) -> tuple[grpc.aio.Server, str] | None:
    """Serve the task logs in ``logs`` (TLS as every service's gRPC); ``active(task_id)``
    says whether a task still runs here. The server and the endpoint admission should
    use, or None when ``settings`` say to serve none or there are no ``keys`` to check
    admission's token with."""
    if settings.address is None:
        return None
    if keys is None:
        log.warning("no QM_AUTH_PUBLIC_KEYS_FILE: task logs are not served")
        return None
    servicer = NodeLogServicer(logs, active, keys=keys, clients=frozenset(settings.clients))
    name = logs_pb2.DESCRIPTOR.services_by_name["NodeLogService"].full_name
    server, port = await start_server(
        settings.address,
        [lambda server: logs_pb2_grpc.add_NodeLogServiceServicer_to_server(servicer, server)],
        [name],
    )
    host = settings.address.rpartition(":")[0]
    servicer.source = settings.endpoint or f"{_reachable(host)}:{port}"
    return server, servicer.source


def _reachable(host: str) -> str:
    """A host others can reach for one this server listens on (every interface: this
    machine's name)."""
    return socket.gethostname() if host in ("", "0.0.0.0", "[::]") else host


class NodeLogServicer(logs_pb2_grpc.NodeLogServiceServicer):
    """Serves the task logs of ``logs`` to the ``clients`` (service identities);
    ``active(task_id)`` says whether the task still runs (or starts) under this agent,
    for ``follow``; ``source`` (its endpoint) names this agent in each chunk."""

    def __init__(
        self,
        logs: TaskLogs,
        active: Callable[[str], bool],
        *,
        keys: Keys,
        clients: frozenset[str],
    ) -> None:
        self._logs = logs
        self._active = active
        self._keys = keys
        self._clients = clients
        self.source = ""

    async def ListTaskLogs(
        self, request: logs_pb2.ListTaskLogsRequest, context: grpc.aio.ServicerContext
    ) -> logs_pb2.ListTaskLogsResponse:
        await self._admit(context)
        await bounded(context, "job_id", request.job_id, MAX_NAME_CHARS)
        reply = logs_pb2.ListTaskLogsResponse()
        for entry in self._logs.entries(request.job_id):
            listed = reply.tasks.add(
                task_id=entry.task_id, node_id=entry.node_id, running=self._active(entry.task_id)
            )
            listed.started_at.FromNanoseconds(int(entry.started * 1e9))
        return reply

    async def ReadTaskLog(
        self, request: logs_pb2.ReadTaskLogRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[logs_pb2.ReadTaskLogResponse]:
        await self._admit(context)
        await bounded(context, "job_id", request.job_id, MAX_NAME_CHARS)
        await bounded(context, "task_id", request.task_id, MAX_TASK_ID_CHARS)
        job_id, task_id = request.job_id, request.task_id
        if not in_job(job_id, task_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task_id {task_id!r} is not one of job {job_id}'s (ListTaskLogs names them)",
            )
        path = self._logs.path(job_id, task_id)
        async for data in read_log(
            path, follow=request.follow, active=lambda: self._active(task_id)
        ):
            yield logs_pb2.ReadTaskLogResponse(data=data, source=self.source)

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        user = await caller(context, self._keys)
        if user not in self._clients:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user} may not read task logs here: ask admission (qm logs JOB)",
            )
