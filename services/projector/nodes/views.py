"""``GET /nodes?cluster=`` -> ``qm.v1.ListNodesResponse``, sorted by node id.

Running tasks are checked against the jobs table (see ``libs.readmodels.nodes``).
"""

from __future__ import annotations

from functools import cache

from faust import web
from qm.v1 import cluster_service_pb2

from libs.readmodels import nodes_in_cluster, without_ended_tasks
from services.projector.app import app
from services.projector.contract import PROTOBUF
from services.projector.jobs.tables import get_job
from services.projector.nodes.tables import all_nodes


@app.page("/nodes")
class NodeListView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        nodes = nodes_in_cluster(all_nodes(), cluster=request.query.get("cluster", ""))
        job_of = cache(get_job)  # a workflow runs on many nodes: put it together once
        reply = cluster_service_pb2.ListNodesResponse(
            nodes=[without_ended_tasks(node, job_of) for node in nodes]
        )
        return self.bytes(reply.SerializeToString(deterministic=True), content_type=PROTOBUF)
