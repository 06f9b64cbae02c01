"""``GET /ready``: 200 once the tables are recovered, the usage ledger is rebuilt
and the worker consumes, else 503.

Until then views would serve partial tables, so whoever starts a worker waits for this.

``GET /config``: 200 while the usage ledger's knobs are placement's (as placement last
announced them on the decisions topic), else 409 naming each knob that differs.
"""

from __future__ import annotations

from typing import cast

from faust import web
from faust.tables.manager import TableManager

from services.projector.app import app
from services.projector.contract import CONFIG, READY
from services.projector.usage import state as usage


@app.page(READY)
class ReadyView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        # The abstract TableManagerT does not declare the recovery service.
        recovered = cast(TableManager, app.tables).recovery.completed.is_set()
        rebuilt = usage.rebuilt.is_set()
        if recovered and rebuilt and not app.rebalancing and not app.in_recovery:
            return self.text("ready")
        return self.text("recovering", status=503)


@app.page(CONFIG)
class ConfigView(web.View):
    async def get(self, request: web.Request) -> web.Response:
        if mismatch := usage.placement.mismatch("projector"):
            return self.text(mismatch, status=409)
        return self.text("the usage ledger's knobs are placement's")
