"""Test envelopes as their writers put them on the log: each event sealed with its
role's key (a node's report with that node's), placement's decisions unsigned on their
own topic; nodes approved by admission before they report.

The keys are fixed (derived from their names), so the trust file ``write_trust`` makes
for a test trusts them whichever copy of a test module asks.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import faust
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from qm.v1 import events_pb2

from libs.auth.keyfiles import private_pem, raw_public
from libs.bus.writers import SERVICE_ROLES, WRITERS, about_node
from libs.events import encode, event_type, new_envelope
from libs.readmodels import approved_key
from libs.trust import SigningKey, seal
from libs.trust.keys import node_key_id, service_key_id
from services.projector.app import TOPICS
from services.projector.nodes.agents import project_nodes
from services.projector.nodes.tables import get_node
from tests.unit.libs.readmodels.readmodel_builders import T0

EVENTS, DECISIONS = TOPICS.events.name, TOPICS.decisions.name


def _private(name: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(name.encode()).digest())


def _service(role: str) -> SigningKey:
    private = _private(f"service {role}")
    return SigningKey(private, service_key_id(role, raw_public(private.public_key())))


SERVICES = {role: _service(role) for role in SERVICE_ROLES}


@functools.cache
def node(node_id: str) -> SigningKey:
    """A node agent's key (the same each time it is asked for)."""
    private = _private(f"node {node_id}")
    return SigningKey(private, node_key_id(node_id, raw_public(private.public_key())))


def write_trust(folder: Path) -> tuple[Path, Path]:
    """A trust file listing the service keys, and the projector's private key, in
    ``folder``: (trust file, key file)."""
    keys = [
        {"role": role, "public_key": base64.b64encode(key.public).decode()}
        for role, key in SERVICES.items()
    ]
    trust = folder / "trust.yaml"
    trust.write_text(yaml.safe_dump({"keys": keys}))
    key = folder / "projector.key"
    key.write_bytes(private_pem(_private("service projector")))
    key.chmod(0o600)  # a private key others may read is refused
    return trust, key


class Writers:
    """Seals an envelope as its writer would (an ``EventProducer``'s sealer)."""

    def seal(self, env: events_pb2.Envelope) -> bytes:
        role = WRITERS.get(event_type(env))
        if role is None:  # placement's: its own topic, unsigned
            return encode(env)
        copy = events_pb2.Envelope()
        copy.CopyFrom(env)
        if role != "node":
            return seal(copy, SERVICES[role])
        key = node(about_node(copy) or "")
        if copy.HasField("node_registered"):
            copy.node_registered.public_key = key.public
        return seal(copy, key)


WRITERS_SEAL = Writers()


def topic_of(env: events_pb2.Envelope) -> str:
    return EVENTS if event_type(env) in WRITERS else DECISIONS


def approved(node_id: str, cluster: str = "default", at: float = T0) -> events_pb2.Envelope:
    """Admission's record of an operator's approval of the node's key."""
    return new_envelope(
        events_pb2.NodeApproved(node_id=node_id, public_key=node(node_id).public, approved_by="op"),
        producer="admission",
        cluster=cluster,
        occurred=datetime.fromtimestamp(at, UTC),
        event_id=f"approved-{cluster}-{node_id}",
    )


def revoked(node_id: str, cluster: str = "default", at: float = T0) -> events_pb2.Envelope:
    return new_envelope(
        events_pb2.NodeRevoked(node_id=node_id, revoked_by="op"),
        producer="admission",
        cluster=cluster,
        occurred=datetime.fromtimestamp(at, UTC),
        event_id=f"revoked-{cluster}-{node_id}@{at}",
    )


async def put(
    test_agent: Any, value: bytes | None, *, topic: str = EVENTS, key: bytes = b"default"
) -> None:
    """Put ``value`` to an agent under test as a record of ``topic`` (the agents check
    the events topic's records, not the decisions topic's)."""
    make = test_agent.to_message

    def on_topic(*args: Any, **kwargs: Any) -> faust.types.Message:
        message: faust.types.Message = make(*args, **kwargs)
        message.topic = topic
        return message

    with mock.patch.object(test_agent, "to_message", on_topic):
        await test_agent.put(value, key=key)


async def put_env(test_agent: Any, env: events_pb2.Envelope) -> None:
    """Put ``env`` as its writer would have written it."""
    await put(test_agent, WRITERS_SEAL.seal(env), topic=topic_of(env))


async def approve(*envs: events_pb2.Envelope) -> None:
    """Have the nodes agent fold admission's approval of each node that reports in
    ``envs`` and has no approved key yet."""
    unapproved = _reporting(envs)
    if not unapproved:
        return
    async with project_nodes.test_context() as agent:
        for node_id, cluster in unapproved.items():
            await put_env(agent, approved(node_id, cluster))


async def feed(agent: faust.types.AgentT[bytes], *envs: events_pb2.Envelope) -> None:
    """Put ``envs`` to ``agent``, as their writers would have, once the nodes that
    report in them are approved."""
    await approve(*envs)
    async with agent.test_context() as test_agent:
        for env in envs:
            await put_env(test_agent, env)


def _reporting(envs: Iterable[events_pb2.Envelope]) -> dict[str, str]:
    found: dict[str, str] = {}
    for env in envs:
        node_id = about_node(env)
        if node_id and node_id not in found and approved_key(get_node(node_id)) is None:
            found[node_id] = env.cluster or "default"
    return found
