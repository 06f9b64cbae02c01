"""Keeps the ``nodes`` table: decode, check (``services.projector.trust``), fold with
``libs.readmodels``, store.

The table holds each node's approved key too (admission's ``node_approved`` and
``node_revoked``), which the gate checks every agent's node records against; this
agent parks the records the gate refuses, once for the projector."""

from __future__ import annotations

import faust

from libs.readmodels import apply_node_event, node_key
from services.projector.app import app
from services.projector.inputs import envelopes, log_topics
from services.projector.nodes.tables import get_node, put_node


@app.agent(log_topics)
async def project_nodes(stream: faust.StreamT[bytes]) -> None:
    async for env in envelopes(stream, consumer="nodes", parks_untrusted=True):
        node_id = node_key(env)
        if node_id is None:
            continue
        node = apply_node_event(get_node(node_id), env)
        if node is not None:
            put_node(node)
