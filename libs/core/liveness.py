"""Node liveness: which agent incarnation each node registered with, and the leases
that heartbeats renew on the log's clock.

A node registered with ``heartbeat_s`` > 0 holds a lease; one silent for longer
than ``node_lost_timeout_s`` of input time is lost (the scheduler ends its work and
takes its GPUs out of the pool until it registers again). Leases are kept oldest
first, so finding the expired ones costs what expires.
"""

from __future__ import annotations

from libs.core.config import PolicyConfig
from libs.core.ids import NodeId
from libs.core.state import State, Table


class Liveness:
    def __init__(self, config: PolicyConfig, state: State) -> None:
        self.config = config
        # The incarnation each node registered with last, and when the nodes that hold a
        # lease were last heard from (input time, oldest first).
        self.incarnations: Table[NodeId, str] = state.table("incarnations")
        self._leases: Table[NodeId, float] = state.table("leases")

    def excuse_silence(self, gap: float) -> None:
        """The log itself was silent for ``gap`` seconds before this input."""
        if self._leases and gap > self.config.node_lost_timeout_s / 2:
            # The broker, or everything that writes to it, was down (the ticker writes
            # every second): nobody could heartbeat, so that silence is held against no
            # node, instead of losing them all at once.
            for node_id, heard in list(self._leases.items()):
                self._leases[node_id] = heard + gap

    def register(self, node_id: NodeId, incarnation: str, heartbeat_s: float, now: float) -> bool:
        """A node (re)registered; whether its agent restarted since it last did (another
        incarnation: the agent killed what it ran)."""
        known = self.incarnations.get(node_id)
        self.incarnations[node_id] = incarnation
        self._lease(node_id, heartbeat_s > 0, now)
        return bool(incarnation) and known is not None and known != incarnation

    def heard(self, node_id: NodeId, incarnation: str, now: float) -> None:
        """A heartbeat renews the lease of the incarnation that holds it, only."""
        if node_id in self._leases and self.incarnations.get(node_id) == incarnation:
            self._lease(node_id, True, now)

    def expire(self, now: float) -> list[tuple[NodeId, str]]:
        """Drop the leases of the nodes silent for longer than the timeout: (node, why)
        for each, oldest first."""
        timeout = self.config.node_lost_timeout_s
        expired: list[tuple[NodeId, str]] = []
        while self._leases:
            node_id, heard = self._leases.first()
            if now - heard <= timeout:
                break
            self._lease(node_id, False, now)
            silent = f"no heartbeat for {now - heard:.0f} s (node_lost_timeout_s {timeout:g})"
            expired.append((node_id, silent))
        return expired

    def forget(self, node_id: NodeId) -> None:
        """Drop the node's lease: it is lost otherwise than by silence."""
        self._leases.pop(node_id)

    def _lease(self, node_id: NodeId, held: bool, now: float) -> None:
        """Renew (``held``) or drop a node's lease; renewing moves it to the back."""
        self._leases.pop(node_id)
        if held:
            self._leases[node_id] = now
