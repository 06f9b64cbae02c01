"""``GET /usage?cluster=`` -> ``qm.v1.GetBalancesResponse``: charged GPU-seconds over the window.

As of the cluster's clock (its latest event), with each allocation's entitlement
(0 when the budget tree does not name it); 503 while the ledger is rebuilt.
"""

from __future__ import annotations

from faust import web
from qm.v1 import budget_service_pb2

from services.projector.app import app
from services.projector.contract import PROTOBUF, USAGE
from services.projector.usage import state


@app.page(USAGE)
class UsageView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        if not state.rebuilt.is_set():
            return self.text("usage is being rebuilt from the log", status=503)
        cluster = state.ledger.cluster(request.query.get("cluster", ""))
        reply = (
            cluster.balances() if cluster is not None else budget_service_pb2.GetBalancesResponse()
        )
        return self.bytes(reply.SerializeToString(deterministic=True), content_type=PROTOBUF)
