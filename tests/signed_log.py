"""Records sealed as their writers seal them, for tests and benches: a recorded log
signed (each node approved before its first report) and the decisions placement makes
of it behind the gate, which the audit bench replays with and without checking; or one
record at a time, as an insider holding the keys would write it (the chaos run's poison).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from qm.v1 import events_pb2

from libs.bus.writers import WRITERS, about_node
from libs.core import PolicyConfig
from libs.events import encode, event_type, new_envelope
from libs.events.log_step import PartitionSchedulers
from libs.trust import Gate, SigningKey, load_trust
from libs.trust.install import init


class Signers:
    """The services' keys and the trust file in ``folder`` (made once), and nodes' keys
    (in ``node_keys``, ``folder/nodes`` unless given: a node agent's key folder)."""

    def __init__(self, folder: Path, node_keys: Path | None = None) -> None:
        self.trust_file = init(folder)
        self._folder = folder
        self._node_keys = node_keys or folder / "nodes"
        self._keys: dict[str, SigningKey] = {}

    def seal(self, env: events_pb2.Envelope) -> bytes:
        """``env``'s record, sealed by its writer's key; unsigned when no role writes it."""
        role = WRITERS.get(event_type(env))
        if role is None:
            return encode(env)
        node_id = about_node(env)
        return (self.node(node_id or "") if role == "node" else self.service(role)).seal(env)

    def service(self, role: str) -> SigningKey:
        if role not in self._keys:
            self._keys[role] = SigningKey.of_service(role, self._folder / f"{role}.key")
        return self._keys[role]

    def node(self, node_id: str) -> SigningKey:
        name = f"node:{node_id}"
        if name not in self._keys:
            self._keys[name] = SigningKey.of_node(node_id, self._node_keys / f"{node_id}.key")
        return self._keys[name]


def sign(inputs: Iterable[events_pb2.Envelope], signers: Signers) -> list[events_pb2.Envelope]:
    """``inputs`` sealed by their writers, with each node's approval before its first report."""
    approved: set[str] = set()
    sealed = []
    for env in inputs:
        node_id = about_node(env)
        if node_id is not None and node_id not in approved:
            approved.add(node_id)
            approval = events_pb2.NodeApproved(
                node_id=node_id, public_key=signers.node(node_id).public, approved_by="bench"
            )
            approve = new_envelope(
                approval, producer="admission", cluster=env.cluster, occurred=env.occurred_at
            )
            signers.service("admission").seal(approve)
            sealed.append(approve)
        signers.seal(env)
        sealed.append(env)
    return sealed


def decide(
    inputs: list[events_pb2.Envelope], trust_file: Path, partition: int
) -> list[events_pb2.Envelope]:
    """What placement decides of ``inputs`` (sealed) behind the gate."""
    schedulers = PartitionSchedulers(PolicyConfig(), gate=Gate(load_trust(trust_file)))
    return [
        out
        for offset, env in enumerate(inputs)
        for out in schedulers.decide(env, partition=partition, offset=offset, record=encode(env))
    ]
