"""Admission reads a job's output from the node agents that ran it (``qm logs``).

Each agent tells where it serves its logs when it registers a node (``NodeRegistered
.log_endpoint``, kept in the projector's node view). Admission calls it as
``svc-log-reader``, an identity of its own that the projector does not accept: a
registration that names a rogue endpoint learns a token good for agents' logs only,
and only for minutes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
from qm.v1 import logs_pb2, logs_pb2_grpc, types_pb2

from libs.config.env import address
from services.grpc_server import bearer
from services.status import Unavailable
from services.tls import TlsSettings, aio_channel

READER = "svc-log-reader"
# Channels to agents kept open; the least recently used one closes past this many.
KEEP_CHANNELS = 64


def job_nodes(job: types_pb2.Job) -> list[str]:
    """The nodes the job's latest placement (or its workflow's tasks) ran on, in order."""
    nodes = [p.node_id for p in job.placements] or ([job.node_id] if job.node_id else [])
    nodes += [task.node_id for task in job.tasks if task.node_id]
    return list(dict.fromkeys(nodes))


def log_sources(nodes: Iterable[str], known: Iterable[types_pb2.Node]) -> list[str]:
    """The agents' endpoints for ``nodes``, each once (an agent may host several); a node
    whose agent serves no logs (or is unknown) has none."""
    endpoints = {n.inventory.node_id: n.log_endpoint for n in known if n.log_endpoint}
    return list(dict.fromkeys(endpoints[node] for node in nodes if node in endpoints))


class TaskLogReader:
    """Streams a job's log from one agent; ``token`` gives a current ``svc-log-reader``
    token; ``tls``: how to reach agents (verifying them against the installation's CA),
    ``tls_name`` the name their certificates carry, if not the address dialled."""

    def __init__(
        self, token: Callable[[], str], tls: TlsSettings, tls_name: str | None = None
    ) -> None:
        self._token = token
        self._tls = tls
        self._options = [("grpc.ssl_target_name_override", tls_name)] if tls_name else None
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()

    async def read(self, endpoint: str, job_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        stub = logs_pb2_grpc.NodeLogServiceStub(await self._channel(endpoint))
        call = stub.ReadTaskLog(
            logs_pb2.ReadTaskLogRequest(job_id=job_id, follow=follow),
            metadata=bearer(self._token()),
        )
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"the node agent at {endpoint}: {exc.details()}") from exc
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
