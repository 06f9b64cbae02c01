"""The gate every reader passes a record through before it folds it: who signed it,
with a key it trusts, and may they say this?

A pure check of one record, given the trust file's service keys and the state the
log itself has built: each node's approved key (``NodeApproved``, ``NodeRevoked``)
and where each task runs. Placement, its standby and the audit replay all check with
it, in the log's order, so a replay refuses exactly what placement refused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from qm.v1 import events_pb2

from libs.auth.keyfiles import fingerprint
from libs.bus.writers import WRITERS, about_node
from libs.core.approvals import ApprovedKey
from libs.events.envelope import event_type, occurred_at
from libs.trust.keys import parse_node_key_id, public_key, signed_body, verifies
from libs.trust.trustfile import TrustFile

Code = Literal[
    "unsigned", "bad_signature", "unknown_key", "revoked_key", "unapproved_node", "out_of_role"
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record is not folded: ``code`` for programs, ``reason`` for people."""

    code: Code
    reason: str

    def parked(self) -> str:
        """What a refused record is dead-lettered with, by every reader that parks one."""
        return parked_reason(self.code, self.reason)


def parked_reason(code: str, reason: str) -> str:
    """The dead-letter reason of a record refused for ``code`` (as its refusal says it)."""
    return f"untrusted ({code}): {reason}"


# The state a check reads: a node's approved key, and the node a task was placed on.
NodeKeyOf = Callable[[str], ApprovedKey | None]
TaskNodeOf = Callable[[str, str], str | None]


# Signatures checked lately, and their verdicts: several readers in one process (the
# projector's agents and its ledger) check each record, and one check is what costs.
REMEMBERED = 4096


class Gate:
    def __init__(self, trust: TrustFile) -> None:
        self._trust = trust
        self._nodes: dict[bytes, Ed25519PublicKey] = {}  # approved keys, parsed once
        self._checked: OrderedDict[tuple[str, bytes, bytes], bool] = OrderedDict()

    def check(
        self,
        env: events_pb2.Envelope,
        record: bytes,
        node_key: NodeKeyOf,
        task_node: TaskNodeOf,
    ) -> Rejection | None:
        """Why ``record`` (decoded: ``env``) must not be folded; None when it may be."""
        kind = event_type(env)
        sealed = signed_body(record)
        if sealed is None or not env.key_id or sealed[1] != env.signature:
            return Rejection("unsigned", f"{kind} is not signed")
        body, signature = sealed
        node = parse_node_key_id(env.key_id)
        if node is None:
            return self._service(env, kind, body, signature)
        return self._node(env, kind, body, signature, node, node_key, task_node)

    def from_service(self, env: events_pb2.Envelope, record: bytes) -> bool:
        """Whether ``record`` is a service's, signed with a key the trust file lists, and
        its role's to write (what a reader that keeps no node state may fold)."""
        sealed = signed_body(record)
        if sealed is None or sealed[1] != env.signature or parse_node_key_id(env.key_id):
            return False
        return self._service(env, event_type(env), *sealed) is None

    def offers(self, env: events_pb2.Envelope, record: bytes) -> bool:
        """Whether ``record`` is a node's registration sealed with the very key it offers
        (so whoever wrote it holds that key): what an operator may be asked to approve."""
        offered = env.node_registered.public_key
        sealed = signed_body(record)
        if not offered or sealed is None or sealed[1] != env.signature:
            return False
        node = parse_node_key_id(env.key_id)
        expected = (env.node_registered.inventory.node_id, fingerprint(offered))
        return node == expected and _verifies(offered, sealed[1], sealed[0])

    def _verifies(self, key_id: str, key: Ed25519PublicKey, signature: bytes, body: bytes) -> bool:
        """Whether ``signature`` is ``key``'s over ``body``; a record checked lately (the
        same key, signature and bytes) is not checked again."""
        seen = (key_id, signature, body)
        verdict = self._checked.get(seen)
        if verdict is None:
            verdict = self._checked[seen] = verifies(key, signature, body)
            if len(self._checked) > REMEMBERED:
                self._checked.popitem(last=False)
        return verdict

    def _service(
        self, env: events_pb2.Envelope, kind: str, body: bytes, signature: bytes
    ) -> Rejection | None:
        key = self._trust.keys.get(env.key_id)
        if key is None:
            return Rejection(
                "unknown_key", f"{kind} is signed by {env.key_id}, not in the trust file"
            )
        if not self._verifies(env.key_id, key.public, signature, body):
            return _bad_signature(kind, env.key_id)
        if key.revoked:
            return Rejection("revoked_key", f"{kind} is signed by {env.key_id}, which is revoked")
        if key.not_after is not None and occurred_at(env) >= key.not_after:
            return Rejection(
                "revoked_key", f"{kind} is signed by {env.key_id}, retired before its time"
            )
        if WRITERS.get(kind) != key.role:
            return _out_of_role(kind, key.role)
        return None

    def _node(
        self,
        env: events_pb2.Envelope,
        kind: str,
        body: bytes,
        signature: bytes,
        node: tuple[str, str],
        node_key: NodeKeyOf,
        task_node: TaskNodeOf,
    ) -> Rejection | None:
        node_id, print_ = node
        approved = node_key(node_id)
        if approved is None or fingerprint(approved.public_key) != print_:
            # Its own registration's key when it offers one: a forged id cannot sign for it.
            offered = env.node_registered.public_key if kind == "node_registered" else b""
            if (
                offered
                and fingerprint(offered) == print_
                and not _verifies(offered, signature, body)
            ):
                return _bad_signature(kind, env.key_id)
            why = (
                "another key is approved for it"
                if approved is not None
                else "no operator has approved it"
            )
            return Rejection(
                "unapproved_node",
                f"{kind} is signed by node {node_id}'s key {print_}, and {why} "
                f"(qm node pending, qm node approve {node_id})",
            )
        key = self._nodes.get(approved.public_key)
        if key is None:
            key = self._nodes[approved.public_key] = public_key(approved.public_key)
        if not self._verifies(env.key_id, key, signature, body):
            return _bad_signature(kind, env.key_id)
        if approved.revoked:
            return Rejection(
                "revoked_key", f"{kind} is signed by node {node_id}, whose key is revoked"
            )
        if WRITERS.get(kind) != "node":
            return _out_of_role(kind, "node")
        about = about_node(env)
        if about != node_id:
            return Rejection(
                "out_of_role", f"node {node_id} may report only about itself, not about {about}"
            )
        task_id = getattr(getattr(env, kind), "task_id", "")
        if task_id:
            placed_on = task_node(getattr(env, kind).job_id, task_id)
            if placed_on is not None and placed_on != node_id:
                return Rejection(
                    "out_of_role",
                    f"node {node_id} reports on task {task_id}, which runs on {placed_on}",
                )
        return None


def _verifies(raw: bytes, signature: bytes, body: bytes) -> bool:
    try:
        return verifies(public_key(raw), signature, body)
    except ValueError:
        return False


def _bad_signature(kind: str, key_id: str) -> Rejection:
    return Rejection("bad_signature", f"{kind}'s signature does not match {key_id}")


def _out_of_role(kind: str, role: str) -> Rejection:
    allowed = WRITERS.get(kind)
    who = f"only {allowed} writes it" if allowed else "it is placement's, on its own topic"
    return Rejection("out_of_role", f"{role} may not write {kind}: {who}")
