"""Ed25519 keys, and records sealed with them.

A sealed record is the envelope's bytes with its ``key_id`` set, then the
``signature`` field (field 8, 64 bytes) appended last: the signature covers every
byte before it, exactly as written, so no reader re-encodes anything to check it,
and a reader of an older schema checks a newer writer's records all the same.

A service's key id is ``<role>:<fingerprint>``; a node agent's is
``node:<node id>:<fingerprint>``, so a reader knows which node's approved key to
check it against.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from qm.v1 import events_pb2

from libs.auth.keyfiles import fingerprint, make_private_key, raw_public, read_private_key
from libs.bus.writers import about_node
from libs.events.envelope import SIGNATURE_TAG, encode, signature_field

SIGNATURE_BYTES = 64
SIGNATURE_PREFIX = bytes([SIGNATURE_TAG, SIGNATURE_BYTES])  # how a signed record's tail starts
_TRAILER = len(SIGNATURE_PREFIX) + SIGNATURE_BYTES
NODE_PREFIX = "node:"


def service_key_id(role: str, public_key: bytes) -> str:
    return f"{role}:{fingerprint(public_key)}"


def node_key_id(node_id: str, public_key: bytes) -> str:
    return f"{NODE_PREFIX}{node_id}:{fingerprint(public_key)}"


def parse_node_key_id(key_id: str) -> tuple[str, str] | None:
    """(node id, fingerprint) of a node's key id; None for a service's."""
    if not key_id.startswith(NODE_PREFIX):
        return None
    node_id, _, print_ = key_id[len(NODE_PREFIX) :].rpartition(":")
    return (node_id, print_) if node_id and print_ else None


def public_key(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 bytes; ``ValueError`` for anything else."""
    return Ed25519PublicKey.from_public_bytes(raw)


class SigningKey:
    """A writer's private key and the key id its records carry."""

    def __init__(self, private: Ed25519PrivateKey, key_id: str) -> None:
        self._private = private
        self.public = raw_public(private.public_key())
        self.key_id = key_id

    @classmethod
    def of_service(cls, role: str, path: Path) -> SigningKey:
        private = load_private(path)
        return cls(private, service_key_id(role, raw_public(private.public_key())))

    @classmethod
    def of_node(cls, node_id: str, path: Path) -> SigningKey:
        """The node's key, made (0600) the first time its agent starts."""
        private = load_or_make_private(path)
        return cls(private, node_key_id(node_id, raw_public(private.public_key())))

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def seal(self, env: events_pb2.Envelope) -> bytes:
        return seal(env, self)


def seal(env: events_pb2.Envelope, key: SigningKey) -> bytes:
    """The record of ``env`` signed by ``key``: its body, then the signature (which
    ``env`` keeps: encoding it again gives the same record)."""
    env.key_id = key.key_id
    env.ClearField("signature")
    body = encode(env)
    env.signature = key.sign(body)
    return body + signature_field(env.signature)


def signed_body(record: bytes) -> tuple[bytes, bytes] | None:
    """(body, signature) of a sealed record; None when it does not end in a signature."""
    if len(record) <= _TRAILER or record[-_TRAILER:-SIGNATURE_BYTES] != SIGNATURE_PREFIX:
        return None
    return record[:-_TRAILER], record[-SIGNATURE_BYTES:]


def verifies(key: Ed25519PublicKey, signature: bytes, body: bytes) -> bool:
    try:
        key.verify(signature, body)
    except InvalidSignature:
        return False
    return True


class NodeKeys:
    """A node agent's keys, one per node it runs (``<dir>/<node id>.key``), made on its
    first start and never sent anywhere: it seals each record with the key of the node
    the record is about, and its registration offers that key's public half."""

    def __init__(self, folder: Path, node_ids: list[str]) -> None:
        self._keys: Mapping[str, SigningKey] = {
            node_id: SigningKey.of_node(node_id, folder / f"{node_id}.key") for node_id in node_ids
        }

    def __getitem__(self, node_id: str) -> SigningKey:
        return self._keys[node_id]

    def seal(self, env: events_pb2.Envelope) -> bytes:
        node_id = about_node(env)
        key = self._keys.get(node_id or "")
        if key is None:
            raise ValueError(f"no key of this agent signs a record about node {node_id!r}")
        if env.HasField("node_registered"):
            env.node_registered.public_key = key.public
        return seal(env, key)


# How to make the keys a trust error points to.
INIT_HINT = "`python -m libs.trust init DIR` makes the services' keys"


def load_private(path: Path) -> Ed25519PrivateKey:
    """A service's key to sign records with (``QM_EVENTS_KEY_FILE``)."""
    return read_private_key(path, "QM_EVENTS_KEY_FILE", INIT_HINT)


def load_or_make_private(path: Path) -> Ed25519PrivateKey:
    """A node's key, made (0600, in a 0700 folder) when there is none."""
    return make_private_key(path, "node key", "made by its agent on first start")
