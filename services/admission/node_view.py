"""Admission's cached view of a cluster's nodes, as the core sees them, fetched from the
projector: what a submission is judged against (a GPU type or memory size no node has
ever offered is refused, not left waiting forever).

The projector keeps every node that ever registered, lost ones too. A view a few
seconds old serves most submissions; a refusal that rests on it asks again first, so a
node that registered a moment ago is never missed.
"""

from __future__ import annotations

import logging
import time

from libs.core import NodeSpec
from libs.events.convert import node_from_proto
from services.projector.client import ProjectorClient, ProjectorError

log = logging.getLogger(__name__)


class NodeView:
    def __init__(self, projector: ProjectorClient, ttl_s: float = 5.0) -> None:
        self._projector = projector
        self._ttl_s = ttl_s
        self._nodes: dict[str, tuple[float, tuple[NodeSpec, ...]]] = {}

    async def nodes(self, cluster: str, *, fresh: bool = False) -> tuple[NodeSpec, ...]:
        """The cluster's nodes; ``fresh``: asked now, not kept. Empty when the projector
        cannot say (nothing is refused for it then: a stale view beats none)."""
        kept = self._nodes.get(cluster)
        if kept is not None and not fresh and time.monotonic() - kept[0] <= self._ttl_s:
            return kept[1]
        try:
            found = await self._projector.list_nodes(cluster)
        except ProjectorError as exc:
            log.warning("cannot check jobs against the nodes the cluster has: %s", exc)
            return kept[1] if kept is not None else ()
        nodes = tuple(node_from_proto(node.inventory) for node in found)
        self._nodes[cluster] = (time.monotonic(), nodes)
        return nodes
