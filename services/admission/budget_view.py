"""Admission's cached view of the budget tree, fetched from the budget service."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from qm.v1 import budget_service_pb2, budget_service_pb2_grpc

from libs.core.budget_tree import BudgetTree
from libs.events.convert import tree_from_proto
from services.grpc_server import bearer
from services.status import Unavailable
from services.tls import TlsSettings, aio_channel


class BudgetUnavailable(Unavailable):
    """Admission has no budget tree: the budget service has not answered yet."""


class BudgetView:
    """``token`` gives admission's current token (a ``ServiceToken``: renewed before it
    expires); ``tls``: how to reach the budget service (verifying it against a CA)."""

    def __init__(
        self, target: str, token: Callable[[], str], tls: TlsSettings, ttl_s: float = 2.0
    ) -> None:
        self._channel = aio_channel(target, tls)
        self._stub = budget_service_pb2_grpc.BudgetServiceStub(self._channel)
        self._token = token
        self._ttl_s = ttl_s
        self._tree: BudgetTree | None = None
        self._fetched = 0.0

    async def tree(self) -> BudgetTree:
        if self._tree is None or time.monotonic() - self._fetched > self._ttl_s:
            try:
                reply = await self._stub.GetTree(
                    budget_service_pb2.GetTreeRequest(), metadata=bearer(self._token()), timeout=5
                )
            except grpc.aio.AioRpcError as exc:
                if self._tree is not None:  # stale beats unavailable
                    return self._tree
                raise BudgetUnavailable(f"budget service: {exc.details()}") from exc
            self._tree, self._fetched = tree_from_proto(reply.tree), time.monotonic()
        return self._tree

    async def close(self) -> None:
        await self._channel.close()
