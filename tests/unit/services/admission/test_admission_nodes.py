"""Operators approve and revoke nodes' keys through admission (ClusterService): what the
log records, what the pending list shows right after, and what is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import events_pb2, types_pb2

from libs.auth.keyfiles import fingerprint
from libs.bus import EventProducer
from libs.bus.memory import MemoryBus
from libs.core.limits import MAX_NAME_CHARS
from libs.events import event_type, new_envelope
from libs.trust.keys import node_key_id
from services.admission.follower import Follower
from services.admission.journal import Journal
from services.admission.node_keys import NodeApprovals
from services.admission.requests import RequestLog
from services.admission.scope import Access
from services.admission.servicer import ClusterServicer
from tests.unit.services.admission.doubles import (
    KEYS,
    TOPIC,
    Aborted,
    Budget,
    Context,
    Projector,
    memory_log,
)

KEY, OTHER = bytes(range(32)), bytes(range(1, 33))
OPERATOR = "olga"
AT = datetime(2025, 10, 9, 8, 53, 20, tzinfo=UTC)


@dataclass
class Admission:
    log: MemoryBus
    service: ClusterServicer
    approvals: NodeApprovals

    async def offer(self, node_id: str, key: bytes = KEY, cluster: str = "default") -> None:
        """The node's agent registers, offering ``key``; once admission has read it."""
        registered = events_pb2.NodeRegistered(
            inventory=types_pb2.NodeInventory(node_id=node_id, cluster=cluster), public_key=key
        )
        env = new_envelope(registered, producer="node-agent", cluster=cluster, occurred=AT)
        env.key_id = node_key_id(node_id, key)
        await EventProducer(self.log, client_id="agent").send(TOPIC, env, key=cluster)
        await self.log.until(
            lambda: any(p.public_key == key for p in self.approvals.pending_node(node_id, cluster))
        )

    async def pending(self, user: str = OPERATOR, cluster: str = "") -> list[cs.PendingNode]:
        request = cs.ListPendingNodesRequest(cluster=cluster)
        return list((await self.service.ListPendingNodes(request, Context(user))).nodes)

    async def approve(
        self, node_id: str, fingerprint: str = "", cluster: str = "", user: str = OPERATOR
    ) -> cs.PendingNode:
        request = cs.ApproveNodeRequest(node_id=node_id, fingerprint=fingerprint, cluster=cluster)
        return (await self.service.ApproveNode(request, Context(user))).node

    async def revoke(
        self, node_id: str, cluster: str = "", user: str = OPERATOR
    ) -> cs.RevokeNodeResponse:
        request = cs.RevokeNodeRequest(node_id=node_id, cluster=cluster)
        return await self.service.RevokeNode(request, Context(user))

    def recorded(self) -> list[events_pb2.Envelope]:
        """What admission wrote: the approvals and revocations."""
        kinds = ("node_approved", "node_revoked")
        return [env for env in self.log.envelopes(TOPIC) if event_type(env) in kinds]


class Lagging:
    """The log, as a reader that takes ``lag_s`` to fold whatever it polled sees it."""

    def __init__(self, log: MemoryBus, lag_s: float) -> None:
        self._log, self._lag_s = log, lag_s

    def consumer(self, *args: Any, **kwargs: Any) -> Any:
        consumer = self._log.consumer(*args, **kwargs)
        getmany = consumer.getmany

        async def slowly(*partitions: Any, **options: Any) -> Any:
            polled = await getmany(*partitions, **options)
            if polled:
                await asyncio.sleep(self._lag_s)
            return polled

        consumer.getmany = slowly  # type: ignore[method-assign]
        return consumer


@asynccontextmanager
async def admission(lag_s: float = 0.0) -> AsyncIterator[Admission]:
    """ClusterService over the in-memory log, its producer and follower as in production
    (the follower ``lag_s`` behind); ``olga`` is an operator, ``alice`` a member of team-a."""
    log, approvals = memory_log(), NodeApprovals()
    producer = EventProducer(log, client_id="admission")
    follower = Follower(Lagging(log, lag_s), TOPIC, [approvals.apply])  # type: ignore[arg-type]
    journal = Journal(producer, TOPIC)
    projector = Projector()
    access = Access(
        projector=projector,  # type: ignore[arg-type]
        budget=Budget(),  # type: ignore[arg-type]
        requests=RequestLog(),
        journal=journal,
        operators=frozenset({OPERATOR}),
    )
    await producer.start()
    await follower.start()
    try:
        service = ClusterServicer(
            projector=projector,  # type: ignore[arg-type]
            keys=KEYS,
            access=access,
            journal=journal,
            approvals=approvals,
            follower=follower,
        )
        yield Admission(log, service, approvals)
    finally:
        await follower.stop()
        await producer.stop()


async def refused(call: Awaitable[Any]) -> Aborted:
    with pytest.raises(Aborted) as caught:
        await call
    return caught.value


async def test_an_approval_is_recorded_and_the_node_is_no_longer_pending() -> None:
    async with admission(lag_s=0.2) as qm:
        await qm.offer("n1")
        [listed] = await qm.pending()
        assert (listed.node_id, listed.cluster, listed.fingerprint) == (
            "n1",
            "default",
            fingerprint(KEY),
        )
        assert listed.offered_at.ToDatetime(UTC) == AT and not listed.replaces_key
        node = await qm.approve("n1", fingerprint=fingerprint(KEY).upper())
        assert node == listed
        assert await qm.pending() == []  # at once: the call waited for the log to be read
        [env] = qm.recorded()
        assert env.cluster == "default" and env.node_approved == events_pb2.NodeApproved(
            node_id="n1", public_key=KEY, approved_by=OPERATOR
        )


async def test_only_operators_list_approve_or_revoke() -> None:
    async with admission() as qm:
        await qm.offer("n1")
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: qm.pending(user="alice"),
            lambda: qm.approve("n1", user="alice"),
            lambda: qm.revoke("n1", user="alice"),
        ]
        for call in calls:
            aborted = await refused(call())
            assert aborted.code == grpc.StatusCode.PERMISSION_DENIED
            assert (
                aborted.details.startswith("alice may not") and "operators only" in aborted.details
            )
        assert qm.recorded() == []


async def test_a_node_that_is_not_pending_is_not_approved() -> None:
    async with admission() as qm:
        aborted = await refused(qm.approve("n1"))
        assert aborted.code == grpc.StatusCode.NOT_FOUND
        assert aborted.details == (
            "no node 'n1' is pending: `qm node pending` lists those that are"
        )
        await qm.offer("n1")
        await qm.approve("n1")
        again = await refused(qm.approve("n1"))  # approved already
        assert again.code == grpc.StatusCode.NOT_FOUND
        elsewhere = await refused(qm.approve("n1", cluster="west"))
        assert (
            elsewhere.code == grpc.StatusCode.NOT_FOUND and "in cluster 'west'" in elsewhere.details
        )
        assert len(qm.recorded()) == 1


async def test_a_fingerprint_that_differs_refuses_the_approval() -> None:
    async with admission() as qm:
        await qm.offer("n1")
        aborted = await refused(qm.approve("n1", fingerprint=fingerprint(OTHER)))
        assert aborted.code == grpc.StatusCode.FAILED_PRECONDITION
        assert fingerprint(KEY) in aborted.details and fingerprint(OTHER) in aborted.details
        assert qm.recorded() == [] and len(await qm.pending()) == 1


async def test_a_node_pending_in_several_clusters_needs_its_cluster_named() -> None:
    async with admission() as qm:
        await qm.offer("n1")
        await qm.offer("n1", OTHER, cluster="west")
        aborted = await refused(qm.approve("n1"))
        assert aborted.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "default, west" in aborted.details and "--cluster" in aborted.details
        node = await qm.approve("n1", cluster="west")
        assert (node.cluster, node.fingerprint) == ("west", fingerprint(OTHER))
        assert [(p.node_id, p.cluster) for p in await qm.pending()] == [("n1", "default")]
        assert [p.cluster for p in await qm.pending(cluster="west")] == []
        [env] = qm.recorded()
        assert env.cluster == "west" and env.node_approved.public_key == OTHER


async def test_a_revoked_node_is_pending_again_when_it_offers_its_key_anew() -> None:
    async with admission() as qm:
        await qm.offer("n1")
        await qm.approve("n1")
        reply = await qm.revoke("n1")
        assert (reply.node_id, reply.cluster) == ("n1", "default")
        assert await qm.pending() == []  # the offer it was approved for is spent
        assert qm.recorded()[-1].node_revoked == events_pb2.NodeRevoked(
            node_id="n1", revoked_by=OPERATOR
        )
        await qm.offer("n1")  # the very key revoked: the operator decides again, told so
        [listed] = await qm.pending()
        assert listed.fingerprint == fingerprint(KEY) and listed.replaces_key
        again = await refused(qm.revoke("n1"))  # revoked already
        assert again.code == grpc.StatusCode.NOT_FOUND


async def test_a_node_without_an_approved_key_is_not_revoked() -> None:
    async with admission() as qm:
        await qm.offer("n1")  # offered, never approved
        aborted = await refused(qm.revoke("n1"))
        assert aborted.code == grpc.StatusCode.NOT_FOUND
        assert aborted.details == "no node 'n1' has an approved key"
        assert qm.recorded() == []


async def test_names_past_the_limits_are_refused() -> None:
    async with admission() as qm:
        long = "n" * (MAX_NAME_CHARS + 1)
        for call in (qm.approve(long), qm.revoke(long), qm.approve("n1", fingerprint=long)):
            aborted = await refused(call)
            assert aborted.code == grpc.StatusCode.INVALID_ARGUMENT
        aborted = await refused(qm.pending(cluster="c" * 1000))
        assert aborted.code == grpc.StatusCode.INVALID_ARGUMENT
