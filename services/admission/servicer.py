"""JobService and ClusterService: each RPC handed to the module of its concern.

A job's submission (``claims``: claimed in the log, judged, admitted or rejected once),
its steering (``steering``: cancel, hold, release, update), what users may read of it
(``queries``), who may see it (``scope``), and what admission writes to the log
(``journal``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
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
from services.admission.journal import Journal
from services.admission.queries import Queries
from services.admission.requests import RequestLog
from services.admission.scope import Access
from services.admission.steering import Steering
from services.admission.tasklogs import TaskLogReader
from services.authn import caller
from services.projector.client import ProjectorClient
from services.status import bounded

__all__ = ["ClusterServicer", "JobServicer", "array_id_for", "job_id_for"]


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
    """Nodes for everyone to see; cordons for operators (``access``), recorded in the
    event log (``journal``, admission's)."""

    def __init__(
        self, *, projector: ProjectorClient, keys: Keys, access: Access, journal: Journal
    ) -> None:
        self._projector = projector
        self._keys = keys
        self._access = access
        self._journal = journal

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
        user = await caller(context, self._keys)
        if not await self._access.is_operator(user):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user} may not cordon or drain nodes: operators only "
                "(QM_OPERATORS, or a manager of the budget tree's root)",
            )
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
