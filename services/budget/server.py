"""BudgetService over gRPC: anyone signed in reads the tree and balances, and the owed and
delivered GPU-hours of the allocations they may see; only managers change the tree."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import grpc
from qm.v1 import budget_service_pb2, budget_service_pb2_grpc, events_pb2

from libs.auth import Keys
from libs.bus import EventProducer
from libs.core.budget_tree import BudgetTree, InvalidTree
from libs.core.limits import MAX_TREE_BYTES
from libs.events import new_envelope
from libs.events.convert import budget_node_from_proto, tree_to_proto
from libs.readmodels import scope_of
from libs.readmodels.delivery import service_levels
from services.authn import caller
from services.budget.book import BudgetBook

WRITE_TIMEOUT_S = 5.0


class BudgetServicer(budget_service_pb2_grpc.BudgetServiceServicer):
    def __init__(
        self,
        book: BudgetBook,
        producer: EventProducer,
        *,
        topic: str,
        clusters: list[str],
        keys: Keys,
        operators: Collection[str] = (),
    ) -> None:
        self._book = book
        self._producer = producer
        self._topic = topic
        self._clusters = clusters
        self._keys = keys
        self._operators = operators  # see every allocation, as in admission
        self._lock = asyncio.Lock()  # one change at a time: no lost updates

    async def GetTree(
        self, request: budget_service_pb2.GetTreeRequest, context: grpc.aio.ServicerContext
    ) -> budget_service_pb2.GetTreeResponse:
        await caller(context, self._keys)
        return budget_service_pb2.GetTreeResponse(
            tree=tree_to_proto(self._tree(), self._book.version)
        )

    async def SetAllocation(
        self, request: budget_service_pb2.SetAllocationRequest, context: grpc.aio.ServicerContext
    ) -> budget_service_pb2.SetAllocationResponse:
        user = await caller(context, self._keys)
        node = budget_node_from_proto(request.node)
        async with self._lock:
            tree = self._tree()
            if 0 < request.expected_version != self._book.version:
                await context.abort(
                    grpc.StatusCode.ABORTED,
                    f"the budget tree changed meanwhile (version {self._book.version}, not "
                    f"{request.expected_version}): read it again and redo the change",
                )
            existing = tree.node(node.name)
            # Weights are claims against siblings, so changing a node takes a
            # manager of its parent (of the root itself for the root).
            guarded = {p for p in (node.parent, existing.parent if existing else "") if p}
            guarded = guarded or {node.name}
            denied = sorted(p for p in guarded if not tree.can_manage(user, p))
            if denied:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{user} does not manage {denied[0]!r}; ask one of its managers",
                )
            if existing == node:  # nothing to change: no new version, nothing written
                return budget_service_pb2.SetAllocationResponse(
                    tree=tree_to_proto(tree, self._book.version)
                )
            try:
                changed = tree.with_node(node)
            except InvalidTree as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"budget tree: {exc}")
            # Read once: the book's follower may fold this very change while it is
            # acknowledged.
            version = self._book.version + 1
            size = tree_to_proto(changed, version).ByteSize()
            if size > MAX_TREE_BYTES:  # every cluster's input would have to carry it
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"budget tree: would be {size} bytes; at most {MAX_TREE_BYTES}",
                )
            await publish_tree(
                self._producer,
                self._topic,
                self._clusters,
                changed,
                version,
                changed_by=user,
                node=node.name,
            )
            self._book.adopt(changed, version)
            return budget_service_pb2.SetAllocationResponse(tree=tree_to_proto(changed, version))

    async def GetBalances(
        self, request: budget_service_pb2.GetBalancesRequest, context: grpc.aio.ServicerContext
    ) -> budget_service_pb2.GetBalancesResponse:
        await caller(context, self._keys)
        # Usage over the lookback window ending at the cluster's latest event.
        cluster = self._book.ledger.cluster(self._clusters[0])
        if cluster is not None:
            return cluster.balances()
        return budget_service_pb2.GetBalancesResponse(
            balances=[
                budget_service_pb2.Balance(allocation=leaf, entitlement=share)
                for leaf, share in self._tree().entitlements().items()
            ]
        )

    async def GetUsage(
        self, request: budget_service_pb2.GetUsageRequest, context: grpc.aio.ServicerContext
    ) -> budget_service_pb2.GetUsageResponse:
        user = await caller(context, self._keys)
        tree = self._tree()
        scope = scope_of(user, tree, self._operators)
        return service_levels(self._book.delivery, tree.entitlements(), scope)

    def _tree(self) -> BudgetTree:
        if self._book.tree is None:
            raise RuntimeError("budget service is serving before its tree is loaded")
        return self._book.tree


async def publish_tree(
    producer: EventProducer,
    topic: str,
    clusters: list[str],
    tree: BudgetTree,
    version: int,
    *,
    changed_by: str,
    node: str,
) -> None:
    """Record a tree change in every cluster's scheduler input."""
    payload = events_pb2.BudgetChanged(
        tree=tree_to_proto(tree, version), changed_by=changed_by, node=node
    )
    for cluster in clusters:
        env = new_envelope(payload, producer="budget", cluster=cluster, correlation_id=node)
        # Bounded: a broker that does not answer makes the call UNAVAILABLE, fast.
        await asyncio.wait_for(producer.send(topic, env, key=cluster), WRITE_TIMEOUT_S)
