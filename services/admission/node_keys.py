"""Nodes' keys as the events topic tells them: what each node's agent offered
(``NodeRegistered.public_key``), and what operators approved (``NodeApproved``) and
revoked (``NodeRevoked``). Admission's follower feeds it every record, in order; it
answers ``qm node pending`` and checks ``qm node approve`` and ``qm node revoke``.

A node is pending when the key its agent last offered is not its approved, unrevoked
key. A revocation consumes the offer of the key it revokes: the node shows pending
again only once its agent offers a key anew, then with ``replaces_key`` set, even
for the very key revoked (an operator who revoked it decides again, knowingly).

An offer whose record names another key (its ``key_id`` is not the node's id with the
offered key's fingerprint) is ignored: placement would never trust it. With the trust
file's gate, an offer counts only when sealed with the key it offers (whoever wrote it
holds that key), and an approval or a revocation only when admission signed it; still,
placement's gate is what trusts a node, and an operator compares the fingerprint with
what the node prints before approving it.

Bounded: node ids past ``MAX_NAME_CHARS``, clusters past ``MAX_TEXT_CHARS`` and keys
that are not 32 bytes are ignored, and at most ``REMEMBER`` nodes are kept (past it, the
node changed least lately is forgotten; a cluster has far fewer).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import cluster_service_pb2, events_pb2

from libs.auth.keyfiles import fingerprint
from libs.core.approvals import ED25519_KEY_BYTES, approved
from libs.core.limits import MAX_NAME_CHARS, MAX_TEXT_CHARS
from libs.events import event_type
from libs.events.envelope import DEFAULT_CLUSTER
from libs.trust import Gate
from libs.trust.keys import node_key_id

REMEMBER = 100_000


@dataclass(frozen=True, slots=True)
class Offer:
    """A key a node's agent offered, and when (the record's ``occurred_at``)."""

    public_key: bytes
    offered_at: Timestamp


@dataclass(slots=True)
class NodeKey:
    """What the log says of one node's keys."""

    approved: bytes = b""  # the approved key; empty: none ever was
    revoked: bool = False  # the approved key was revoked
    offer: Offer | None = None  # the last key offered, unless a revocation consumed it

    def trusted(self) -> bytes:
        """The key its records are trusted under; empty: none."""
        return b"" if self.revoked else self.approved

    def pending(self) -> Offer | None:
        """The offer awaiting an operator, if any."""
        if self.offer is None or self.offer.public_key == self.trusted():
            return None
        return self.offer


@dataclass(frozen=True, slots=True)
class Pending:
    """A node whose agent offered a key no operator has approved."""

    node_id: str
    cluster: str
    public_key: bytes
    offered_at: Timestamp
    replaces_key: bool  # a key was approved before: another one, or this one revoked

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def to_proto(self) -> cluster_service_pb2.PendingNode:
        return cluster_service_pb2.PendingNode(
            node_id=self.node_id,
            cluster=self.cluster,
            fingerprint=self.fingerprint,
            offered_at=self.offered_at,
            replaces_key=self.replaces_key,
        )


class NodeApprovals:
    """The view: per (cluster, node id), the node's approved key and its last offer.
    ``gate``: an offer counts only when sealed with the key it offers, an approval or a
    revocation only when admission signed it; None believes every one (tests)."""

    def __init__(self, remember: int = REMEMBER, gate: Gate | None = None) -> None:
        self._remember = remember
        self._gate = gate
        self._nodes: OrderedDict[tuple[str, str], NodeKey] = OrderedDict()

    def apply(self, env: events_pb2.Envelope, record: bytes) -> None:
        """Fold one record of the events topic."""
        match event_type(env):
            case "node_registered" if self._gate is None or self._gate.offers(env, record):
                self._offer(env)
            case "node_approved" | "node_revoked" if self._gate and not self._gate.from_service(
                env, record
            ):
                return
            case "node_approved":
                key = approved(env.node_approved.public_key)
                node = self._node(env, env.node_approved.node_id, create=key is not None)
                if node is not None and key is not None:
                    node.approved, node.revoked = key.public_key, False
            case "node_revoked":
                node = self._node(env, env.node_revoked.node_id, create=False)
                if node is not None and node.approved and not node.revoked:
                    node.revoked = True
                    if node.offer is not None and node.offer.public_key == node.approved:
                        node.offer = None

    def pending(self, cluster: str = "") -> list[Pending]:
        """The pending nodes of ``cluster`` (empty: of every cluster), by cluster, then
        node id."""
        found = []
        for (in_cluster, node_id), node in self._nodes.items():
            offer = node.pending()
            if offer is None or (cluster and in_cluster != cluster):
                continue
            found.append(
                Pending(
                    node_id,
                    in_cluster,
                    offer.public_key,
                    offer.offered_at,
                    replaces_key=bool(node.approved),
                )
            )
        return sorted(found, key=lambda p: (p.cluster, p.node_id))

    def pending_node(self, node_id: str, cluster: str = "") -> list[Pending]:
        """Where ``node_id`` is pending: in ``cluster``, or (empty) in any cluster."""
        return [p for p in self.pending(cluster) if p.node_id == node_id]

    def trusted_in(self, node_id: str, cluster: str = "") -> list[str]:
        """The clusters (``cluster`` alone, or every one when empty) where ``node_id``
        has an approved, unrevoked key, sorted."""
        return sorted(
            in_cluster
            for (in_cluster, node), keys in self._nodes.items()
            if node == node_id and keys.trusted() and (not cluster or in_cluster == cluster)
        )

    def _offer(self, env: events_pb2.Envelope) -> None:
        key, node_id = env.node_registered.public_key, env.node_registered.inventory.node_id
        if len(key) != ED25519_KEY_BYTES:
            return
        if env.key_id and env.key_id != node_key_id(node_id, key):
            return  # signed as another node, or with another key than it offers
        node = self._node(env, node_id, create=True)
        if node is not None:
            offered_at = Timestamp()
            offered_at.CopyFrom(env.occurred_at)
            node.offer = Offer(key, offered_at)

    def _node(self, env: events_pb2.Envelope, node_id: str, *, create: bool) -> NodeKey | None:
        cluster = env.cluster or DEFAULT_CLUSTER
        if not node_id or len(node_id) > MAX_NAME_CHARS or len(cluster) > MAX_TEXT_CHARS:
            return None
        name = (cluster, node_id)
        node = self._nodes.get(name)
        if node is None:
            if not create:
                return None
            node = self._nodes[name] = NodeKey()
            if len(self._nodes) > self._remember:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(name)
        return node
