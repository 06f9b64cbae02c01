"""The agent's nodes as placement knows them: each registered under an incarnation, and
said to be alive by a heartbeat every few seconds.

A new incarnation tells placement that the tasks of an earlier one are gone. A
restarted agent that took a node's tasks back (``orphans.adopt``) registers it again
with the incarnation it had, so that placement keeps counting them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from qm.v1 import events_pb2, types_pb2

from libs.events.wire_time import duration
from services.node_agent.orphans import new_incarnation
from services.node_agent.reports import Reporter, envelope

log = logging.getLogger(__name__)

# Placement declares a node lost after node_lost_timeout_s (30 s by default) of silence.
DEFAULT_HEARTBEAT_S = 5.0
# How often a node placement does not trust yet offers its registration again, when it
# has no heartbeat to take the place of.
UNTRUSTED_RETRY_S = 5.0


class Registrations:
    """``nodes`` with their current incarnations; a heartbeat every ``heartbeat_s``
    seconds (0: never); ``log_endpoint``: where the agent serves its task logs;
    ``cache_model``: how its GPU caches make room, stated so placement can check it."""

    def __init__(
        self,
        nodes: Sequence[types_pb2.NodeInventory],
        report: Reporter,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        log_endpoint: str = "",
        cache_model: str = "",
        incarnations: Mapping[str, str] | None = None,
        keep: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        """``incarnations``: those to register with (new ones for the other nodes);
        ``keep`` is told each time they change (the next agent's ``adopt`` reads them)."""
        if heartbeat_s < 0:
            raise ValueError("heartbeat_s must be >= 0")
        self.nodes = {node.node_id: node for node in nodes}
        given = incarnations or {}
        self._incarnations = {
            node_id: given.get(node_id) or new_incarnation() for node_id in self.nodes
        }
        self._keep = keep
        self._report = report
        self._heartbeat_s = heartbeat_s
        self._log_endpoint = log_endpoint
        self._cache_model = cache_model
        # Nodes whose records placement refused for their key (not approved yet, or
        # revoked): each registers again at its next beat, until one is not refused.
        self._untrusted: set[str] = set()

    @property
    def incarnations(self) -> Mapping[str, str]:
        """Node id -> its current incarnation."""
        return self._incarnations

    async def register_all(self) -> None:
        for node in self.nodes.values():
            await self._register(node)

    async def register_anew(self, node_id: str) -> None:
        """Register the node again, as a new incarnation."""
        self._incarnations[node_id] = new_incarnation()
        if self._keep is not None:
            self._keep(self._incarnations)
        await self._register(self.nodes[node_id])

    async def _register(self, node: types_pb2.NodeInventory) -> None:
        incarnation = self._incarnations[node.node_id]
        registered = events_pb2.NodeRegistered(
            inventory=node,
            incarnation=incarnation,
            heartbeat_interval=duration(self._heartbeat_s),
            log_endpoint=self._log_endpoint,
            cache_model=self._cache_model,
        )
        await self._report(node, registered)
        log.info("registered node %s (%s): %d GPUs", node.node_id, incarnation, len(node.gpus))

    def untrusted(self, node_id: str, reason: str) -> None:
        """Placement refused a record of the node for its key: until an operator approves
        it, what it registered was never heard, so it registers again at its next beat."""
        if node_id in self.nodes and node_id not in self._untrusted:
            self._untrusted.add(node_id)
            log.warning("node %s: placement refuses its records: %s", node_id, reason)

    async def heartbeat(self) -> None:
        """Say every ``heartbeat_s`` that each node is alive, until cancelled; a node
        placement does not trust registers again instead. A beat that cannot be sent is
        skipped: the next one says the same."""
        while True:
            await asyncio.sleep(self._heartbeat_s or UNTRUSTED_RETRY_S)
            for node_id, node in self.nodes.items():
                try:
                    if node_id in self._untrusted:
                        self._untrusted.discard(node_id)
                        await self._register(node)
                    elif self._heartbeat_s:
                        beat = events_pb2.NodeHeartbeat(
                            node_id=node_id, incarnation=self._incarnations[node_id]
                        )
                        await self._report.emit(envelope(node, beat))
                except Exception as exc:
                    log.warning("heartbeat of %s not sent: %s", node_id, exc)
