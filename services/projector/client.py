"""Queries the projector's views over HTTP; imports neither faust nor the app."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import quote

import aiohttp
from google.protobuf.message import DecodeError, Message
from qm.v1 import budget_service_pb2, cluster_service_pb2, job_service_pb2, types_pb2

from libs.readmodels import ALL_JOBS, DEFAULT_LIST_LIMIT, JobFilter, Scope
from services.projector.contract import PROTOBUF, READY, USAGE

# Query parameters; a name may repeat (allocations=a&allocations=b).
Params = Mapping[str, str] | Sequence[tuple[str, str]]
_M = TypeVar("_M", bound=Message)


class ProjectorError(RuntimeError):
    """The projector answered, but not with what was asked for."""


class ProjectorUnavailable(ProjectorError):
    """The projector cannot be reached (not started, wrong address, or timed out)."""


class ProjectorClient:
    """One HTTP session to one projector; call ``close()`` (or use ``async with``)."""

    def __init__(
        self, base_url: str, *, token: Callable[[], str] | None = None, timeout_s: float = 10.0
    ) -> None:
        """``token`` gives the caller's current token (the projector wants one of a
        service it knows: ``services.projector.access``)."""
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # Made on first use: a session belongs to the event loop it was made in.
        self._session: aiohttp.ClientSession | None = None

    async def get_job(self, job_id: str) -> types_pb2.Job | None:
        """The job, or None when the projector has not seen it."""
        path = f"/jobs/{quote(job_id, safe='')}"
        return await self._get(path, {}, types_pb2.Job)

    async def list_jobs(
        self,
        where: JobFilter = ALL_JOBS,
        limit: int = DEFAULT_LIST_LIMIT,
        scope: Scope | None = None,
    ) -> list[types_pb2.Job]:
        """The jobs ``where`` asks for that ``scope`` admits, newest first."""
        params = [
            ("limit", str(limit)),
            *([("allocation", where.allocation)] if where.allocation else []),
            *([("owner", where.user)] if where.user else []),
            *(("state", types_pb2.JobState.Name(s)) for s in sorted(where.states)),
            *([("array", where.array_id)] if where.array_id else []),
        ]
        if scope is not None:
            params += [
                ("user", scope.user),
                *(("allocations", a) for a in sorted(scope.allocations)),
            ]
        reply = await self._get_found("/jobs", params, job_service_pb2.ListJobsResponse)
        return list(reply.jobs)

    async def list_nodes(self, cluster: str = "") -> list[types_pb2.Node]:
        """Nodes of a cluster (all when empty), sorted by node id."""
        params = {"cluster": cluster} if cluster else {}
        reply = await self._get_found("/nodes", params, cluster_service_pb2.ListNodesResponse)
        return list(reply.nodes)

    async def usage(self, cluster: str = "") -> budget_service_pb2.GetBalancesResponse:
        """Charged GPU-seconds and entitlements over the lookback window of a cluster.

        ``cluster`` defaults to the default cluster; an unknown one has no balances.
        """
        params = {"cluster": cluster} if cluster else {}
        return await self._get_found(USAGE, params, budget_service_pb2.GetBalancesResponse)

    async def ready(self) -> bool:
        """Whether the projector serves complete tables; False while it starts or is down."""
        try:
            async with self._http().get(self.base_url + READY) as response:
                return response.status == 200
        except (aiohttp.ClientConnectionError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ProjectorClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _get_found(self, path: str, params: Params, reply_type: type[_M]) -> _M:
        reply = await self._get(path, params, reply_type)
        if reply is None:
            raise ProjectorError(f"{self.base_url}{path} not found: is this a projector?")
        return reply

    async def _get(self, path: str, params: Params, reply_type: type[_M]) -> _M | None:
        """GET one protobuf message; None on 404."""
        url = self.base_url + path
        try:
            headers = {"Authorization": f"Bearer {self._token()}"} if self._token else {}
            async with self._http().get(url, params=params, headers=headers) as response:
                body = await response.read()
                content_type = response.content_type
                status = response.status
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ProjectorUnavailable(f"projector at {self.base_url} unreachable: {exc}") from exc
        if status == 404:
            return None
        if status != 200 or content_type != PROTOBUF:
            text = body[:200].decode(errors="replace")
            raise ProjectorError(f"GET {url} answered {status} ({content_type}): {text}")
        try:
            return reply_type.FromString(body)
        except DecodeError as exc:
            raise ProjectorError(f"GET {url} answered with a bad {reply_type.__name__}") from exc
