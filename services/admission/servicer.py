"""JobService and ClusterService: each RPC handed to the module of its concern.

A job's submission (``claims``: claimed in the log, judged, admitted or rejected once),
its steering (``steering``: cancel, hold, release, update), what users may read of it
(``queries``), who may see it (``scope``), and what admission writes to the log
(``journal``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import Message
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.auth import Keys
from libs.bus import EventProducer
from libs.core import Limits
from libs.core.limits import MAX_NAME_CHARS, MAX_TEXT_CHARS
from services.admission.budget_view import BudgetView
from services.admission.claims import Submissions, array_id_for, job_id_for
from services.admission.explainer import Explainer
from services.admission.follower import Follower
from services.admission.journal import LOG_TIMEOUT_S, Journal
from services.admission.node_keys import NodeApprovals
from services.admission.queries import Queries
from services.admission.requests import RequestLog
from services.admission.scope import Access
from services.admission.steering import Steering
from services.admission.tasklogs import TaskLogReader
from services.authn import caller
from services.projector.client import ProjectorClient
from services.status import bounded

__all__ = ["ClusterServicer", "JobServicer", "array_id_for", "job_id_for"]

log = logging.getLogger("admission")


class JobServicer(js_grpc.JobServiceServicer):
    def __init__(
        self,
        *,
        producer: EventProducer,
        topic: str,
        budget: BudgetView,
        projector: ProjectorClient,
        limits: Limits,
        keys: Keys,
        explainer: Explainer,
        requests: RequestLog,
        follower: Follower,
        logs: TaskLogReader,
        operators: frozenset[str] = frozenset(),
        watch_interval_s: float = 0.2,
    ) -> None:
        """``operators`` see every job (as the root's managers do) and change nothing more;
        ``logs`` reads jobs' output from the agents that ran them."""
        self.journal = Journal(producer, topic)
        self.access = Access(
            projector=projector,
            budget=budget,
            requests=requests,
            journal=self.journal,
            operators=operators,
        )
        self.submissions = Submissions(
            journal=self.journal,
            access=self.access,
            budget=budget,
            projector=projector,
            limits=limits,
            keys=keys,
            requests=requests,
            follower=follower,
        )
        self._steering = Steering(
            journal=self.journal,
            access=self.access,
            submissions=self.submissions,
            budget=budget,
            keys=keys,
        )
        self._queries = Queries(
            access=self.access,
            projector=projector,
            keys=keys,
            explainer=explainer,
            logs=logs,
            watch_interval_s=watch_interval_s,
        )

    async def SubmitJob(
        self, request: js.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> js.SubmitJobResponse:
        return await self.submissions.SubmitJob(request, context)

    async def CancelJob(
        self, request: js.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> js.CancelJobResponse:
        return await self._steering.CancelJob(request, context)

    async def HoldJob(
        self, request: js.HoldJobRequest, context: grpc.aio.ServicerContext
    ) -> js.HoldJobResponse:
        return await self._steering.HoldJob(request, context)

    async def ReleaseJob(
        self, request: js.ReleaseJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ReleaseJobResponse:
        return await self._steering.ReleaseJob(request, context)

    async def UpdateJob(
        self, request: js.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> js.UpdateJobResponse:
        return await self._steering.UpdateJob(request, context)

    async def GetJob(
        self, request: js.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> js.GetJobResponse:
        return await self._queries.GetJob(request, context)

    async def ListJobs(
        self, request: js.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> js.ListJobsResponse:
        return await self._queries.ListJobs(request, context)

    def WatchJob(
        self, request: js.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.WatchJobResponse]:
        return self._queries.WatchJob(request, context)

    def StreamLogs(
        self, request: js.StreamLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.StreamLogsResponse]:
        return self._queries.StreamLogs(request, context)

    async def ExplainJob(
        self, request: js.ExplainJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ExplainJobResponse:
        return await self._queries.ExplainJob(request, context)


class ClusterServicer(cluster_service_pb2_grpc.ClusterServiceServicer):
    """Nodes for everyone to see; cordons, and approving or revoking nodes' keys, for
    operators (``access``), recorded in the event log (``journal``, admission's), whose
    nodes' keys ``approvals`` folds as ``follower`` reads it."""

    def __init__(
        self,
        *,
        projector: ProjectorClient,
        keys: Keys,
        access: Access,
        journal: Journal,
        approvals: NodeApprovals,
        follower: Follower,
    ) -> None:
        self._projector = projector
        self._keys = keys
        self._access = access
        self._journal = journal
        self._approvals = approvals
        self._follower = follower

    async def CordonNode(
        self, request: cluster_service_pb2.CordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.CordonNodeResponse:
        node = await self._cordon(request.node_id, True, request.drain, context)
        return cluster_service_pb2.CordonNodeResponse(node=node)

    async def UncordonNode(
        self, request: cluster_service_pb2.UncordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.UncordonNodeResponse:
        node = await self._cordon(request.node_id, False, False, context)
        return cluster_service_pb2.UncordonNodeResponse(node=node)

    async def _cordon(
        self, node_id: str, cordoned: bool, drain: bool, context: grpc.aio.ServicerContext
    ) -> types_pb2.Node:
        user = await self._operator(context, "cordon or drain nodes")
        await bounded(context, "node_id", node_id, MAX_NAME_CHARS)
        nodes = {n.inventory.node_id: n for n in await self._projector.list_nodes()}
        node = nodes.get(node_id)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no node {node_id!r}")
        assert node is not None
        event = events_pb2.NodeCordoned(
            node_id=node_id, cordoned=cordoned, drain=drain, requested_by=user
        )
        await self._journal.record([event], node_id, node.inventory.cluster or "default")
        return node

    async def ListNodes(
        self, request: cluster_service_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.ListNodesResponse:
        await caller(context, self._keys)
        await bounded(context, "cluster", request.cluster, MAX_TEXT_CHARS)
        return cluster_service_pb2.ListNodesResponse(
            nodes=await self._projector.list_nodes(request.cluster)
        )

    async def ListPendingNodes(
        self,
        request: cluster_service_pb2.ListPendingNodesRequest,
        context: grpc.aio.ServicerContext,
    ) -> cluster_service_pb2.ListPendingNodesResponse:
        await self._operator(context, "list pending nodes")
        await bounded(context, "cluster", request.cluster, MAX_TEXT_CHARS)
        pending = self._approvals.pending(request.cluster)
        return cluster_service_pb2.ListPendingNodesResponse(nodes=[p.to_proto() for p in pending])

    async def ApproveNode(
        self, request: cluster_service_pb2.ApproveNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.ApproveNodeResponse:
        """Record the approval of the key a pending node offered; answered once this
        instance has read it back, so that the node is no longer listed pending."""
        user = await self._operator(context, "approve nodes")
        node_id, cluster = request.node_id, request.cluster
        await bounded(context, "node_id", node_id, MAX_NAME_CHARS)
        await bounded(context, "fingerprint", request.fingerprint, MAX_NAME_CHARS)
        await bounded(context, "cluster", cluster, MAX_TEXT_CHARS)
        found = self._approvals.pending_node(node_id, cluster)
        if not found:
            where = f" in cluster {cluster!r}" if cluster else ""
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no node {node_id!r} is pending{where}: `qm node pending` lists those that are",
            )
        if len(found) > 1:
            clusters = ", ".join(p.cluster for p in found)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node_id!r} is pending in several clusters ({clusters}): "
                "name one (--cluster)",
            )
        pending = found[0]
        wanted = request.fingerprint.strip().lower()
        if wanted and wanted != pending.fingerprint:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {node_id!r} offers key {pending.fingerprint}, not {wanted}: "
                "nothing was approved (check the key the node prints: "
                "python -m services.node_agent --show-keys)",
            )
        event = events_pb2.NodeApproved(
            node_id=node_id, public_key=pending.public_key, approved_by=user
        )
        await self._record(event, node_id, pending.cluster)
        return cluster_service_pb2.ApproveNodeResponse(node=pending.to_proto())

    async def RevokeNode(
        self, request: cluster_service_pb2.RevokeNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.RevokeNodeResponse:
        """Record the revocation of a node's approved key; answered once this instance
        has read it back."""
        user = await self._operator(context, "revoke nodes")
        node_id, cluster = request.node_id, request.cluster
        await bounded(context, "node_id", node_id, MAX_NAME_CHARS)
        await bounded(context, "cluster", cluster, MAX_TEXT_CHARS)
        clusters = self._approvals.trusted_in(node_id, cluster)
        if not clusters:
            where = f" in cluster {cluster!r}" if cluster else ""
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no node {node_id!r} has an approved key{where}"
            )
        if len(clusters) > 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node_id!r} is approved in several clusters ({', '.join(clusters)}): "
                "name one (--cluster)",
            )
        event = events_pb2.NodeRevoked(node_id=node_id, revoked_by=user)
        await self._record(event, node_id, clusters[0])
        return cluster_service_pb2.RevokeNodeResponse(node_id=node_id, cluster=clusters[0])

    async def _operator(self, context: grpc.aio.ServicerContext, what: str) -> str:
        """The caller, if an operator; else PERMISSION_DENIED."""
        user = await caller(context, self._keys)
        if not await self._access.is_operator(user):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user} may not {what}: operators only "
                "(QM_OPERATORS, or a manager of the budget tree's root)",
            )
        return user

    async def _record(self, event: Message, node_id: str, cluster: str) -> None:
        """Append ``event`` and read the log up to it, so that this instance's view of
        nodes' keys has it before the call is answered."""
        [(_, written)] = await self._journal.record([event], node_id, cluster)
        try:
            await asyncio.wait_for(
                self._follower.reached(written.topic_partition, written.offset), LOG_TIMEOUT_S
            )
        except TimeoutError:  # recorded all the same: a retry would find nothing to do
            log.warning(
                "%s of node %s recorded, but not read back within %g s: "
                "qm node pending may show the node as before for a while",
                type(event).__name__,
                node_id,
                LOG_TIMEOUT_S,
            )
