"""Admission's view of nodes' keys: what agents offered, what operators approved and
revoked, and so which nodes are pending."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from qm.v1 import events_pb2, types_pb2

from libs.auth.keyfiles import fingerprint
from libs.core.limits import MAX_NAME_CHARS
from libs.events import encode, new_envelope
from libs.trust import Gate, load_trust
from libs.trust.keys import node_key_id
from services.admission.node_keys import NodeApprovals
from tests.signed_log import Signers

KEY, OTHER = bytes(range(32)), bytes(range(1, 33))


def offered(
    node_id: str, key: bytes = KEY, *, cluster: str = "default", at: int = 1_760_000_000
) -> events_pb2.Envelope:
    """A node's agent registering, offering ``key``, its record signed with it."""
    registered = events_pb2.NodeRegistered(
        inventory=types_pb2.NodeInventory(node_id=node_id, cluster=cluster), public_key=key
    )
    occurred = datetime.fromtimestamp(at, UTC)
    env = new_envelope(registered, producer="node-agent", cluster=cluster, occurred=occurred)
    env.key_id = node_key_id(node_id, key)
    return env


def approved(node_id: str, key: bytes = KEY, cluster: str = "default") -> events_pb2.Envelope:
    event = events_pb2.NodeApproved(node_id=node_id, public_key=key, approved_by="olga")
    return new_envelope(event, producer="admission", cluster=cluster)


def revoked(node_id: str, cluster: str = "default") -> events_pb2.Envelope:
    event = events_pb2.NodeRevoked(node_id=node_id, revoked_by="olga")
    return new_envelope(event, producer="admission", cluster=cluster)


def fold(view: NodeApprovals, env: events_pb2.Envelope) -> None:
    view.apply(env, encode(env))


def folded(*envs: events_pb2.Envelope) -> NodeApprovals:
    view = NodeApprovals()
    for env in envs:
        fold(view, env)
    return view


def pending(view: NodeApprovals, cluster: str = "") -> list[tuple[str, str, str, bool]]:
    return [(p.cluster, p.node_id, p.fingerprint, p.replaces_key) for p in view.pending(cluster)]


def test_an_offered_key_is_pending_until_approved() -> None:
    view = folded(offered("n1", at=1_760_000_123))
    [node] = view.pending()
    assert (node.node_id, node.cluster, node.public_key) == ("n1", "default", KEY)
    assert node.fingerprint == fingerprint(KEY) and len(node.fingerprint) == 32
    assert node.offered_at.seconds == 1_760_000_123 and not node.replaces_key
    assert node.to_proto().fingerprint == fingerprint(KEY)
    fold(view, approved("n1"))
    assert view.pending() == [] and view.trusted_in("n1") == ["default"]
    fold(view, offered("n1"))  # its agent restarts: the same key is trusted already
    assert view.pending() == []


def test_another_key_offered_replaces_the_approved_one() -> None:
    view = folded(offered("n1"), approved("n1"), offered("n1", OTHER))
    assert pending(view) == [("default", "n1", fingerprint(OTHER), True)]
    assert view.trusted_in("n1") == ["default"]  # the old key is trusted until replaced
    fold(view, approved("n1", OTHER))
    assert pending(view) == []


def test_a_revoked_node_is_pending_again_only_once_it_offers_a_key_again() -> None:
    view = folded(offered("n1"), approved("n1"), revoked("n1"))
    assert pending(view) == [] and view.trusted_in("n1") == []
    # The very key revoked, offered anew: an operator decides again, told it replaces one.
    fold(view, offered("n1"))
    assert pending(view) == [("default", "n1", fingerprint(KEY), True)]
    fold(view, approved("n1"))
    assert pending(view) == [] and view.trusted_in("n1") == ["default"]


def test_a_revocation_leaves_a_pending_replacement_pending() -> None:
    view = folded(offered("n1"), approved("n1"), offered("n1", OTHER), revoked("n1"))
    assert pending(view) == [("default", "n1", fingerprint(OTHER), True)]


def test_nodes_are_kept_per_cluster_and_listed_in_order() -> None:
    view = folded(offered("n2"), offered("n1", cluster="west"), offered("n1"))
    assert [(c, n) for c, n, *_ in pending(view)] == [
        ("default", "n1"),
        ("default", "n2"),
        ("west", "n1"),
    ]
    assert [p.cluster for p in view.pending_node("n1")] == ["default", "west"]
    assert [p.node_id for p in view.pending("west")] == ["n1"]
    fold(view, approved("n1", cluster="west"))
    assert view.trusted_in("n1") == ["west"] and view.trusted_in("n1", "default") == []
    assert [p.cluster for p in view.pending_node("n1")] == ["default"]


def test_what_it_cannot_trust_or_keep_is_ignored() -> None:
    short = offered("n1", KEY[:31])
    forged = offered("n2")
    forged.key_id = node_key_id("n2", OTHER)  # signed with a key other than it offers
    as_another = offered("n3")
    as_another.key_id = node_key_id("n9", KEY)
    long_name = offered("n" * (MAX_NAME_CHARS + 1))
    unsigned = offered("n4")
    unsigned.key_id = ""  # placement refuses it, but the operator may still look at it
    view = folded(short, forged, as_another, long_name, unsigned, approved("n5", KEY[:16]))
    assert [p.node_id for p in view.pending()] == ["n4"]
    assert view.trusted_in("n5") == []
    fold(view, revoked("n6"))  # nothing approved: nothing to revoke
    assert view.trusted_in("n6") == [] and [p.node_id for p in view.pending()] == ["n4"]


def test_it_keeps_at_most_so_many_nodes() -> None:
    view = NodeApprovals(remember=2)
    for node_id in ("n1", "n2", "n3"):
        fold(view, offered(node_id))
    assert [p.node_id for p in view.pending()] == ["n2", "n3"]


def test_behind_the_gate_only_offers_sealed_by_their_key_and_admissions_approvals_count(
    tmp_path: Path,
) -> None:
    signers = Signers(tmp_path)
    view = NodeApprovals(gate=Gate(load_trust(signers.trust_file)))
    n1, stranger = signers.node("n1"), signers.node("n2")
    own = events_pb2.NodeRegistered(inventory=types_pb2.NodeInventory(node_id="n1"))
    own.public_key = n1.public
    offer = new_envelope(own, producer="agent")
    view.apply(offer, n1.seal(offer))
    forged = new_envelope(own, producer="agent")  # n1's key offered, another key signs
    forged.node_registered.inventory.node_id = "n3"
    view.apply(forged, stranger.seal(forged))
    assert [p.node_id for p in view.pending()] == ["n1"]
    approval = approved("n1", n1.public)
    view.apply(approval, encode(approval))  # unsigned
    assert [p.node_id for p in view.pending()] == ["n1"]
    view.apply(approval, signers.service("admission").seal(approval))
    assert view.pending() == []
