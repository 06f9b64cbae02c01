"""The trust file: the public keys of the services that write the event log, by role.

A YAML file (a ConfigMap on Kubernetes, ``.local/trust/trust.yaml`` on the local
stack)::

    keys:
      - role: admission
        public_key: <base64 of the key's 32 bytes>
      - role: admission                  # the key it replaced
        public_key: ...
        not_after: 2026-12-01T00:00:00Z  # records stamped from then on are refused
      - role: budget
        public_key: ...
        revoked: true                    # stolen: every record it signed is refused

To rotate a key: add the new one, give the service the new private key, then give
the old entry a ``not_after`` of when the switch was made. Its records from before
stay trusted, so an audit of them still replays the same. ``revoked`` is for a key
that leaked: it refuses every record signed with it, old ones too, so an audit
flags whatever placement decided from them. A node's key is not here: an operator
approves it on the log (``qm node approve``).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import field_validator

from libs.bus.writers import SERVICE_ROLES, Role
from libs.config.document import ConfigError, FileModel, load
from libs.trust.keys import public_key, service_key_id


class KeyEntry(FileModel):
    role: Role
    public_key: str
    revoked: bool = False
    not_after: datetime | None = None

    @field_validator("role")
    @classmethod
    def _service(cls, role: Role) -> Role:
        if role not in SERVICE_ROLES:
            raise ValueError(
                f"must be one of {', '.join(SERVICE_ROLES)} (a node's key is approved "
                "with qm node approve, not listed here)"
            )
        return role

    @field_validator("public_key")
    @classmethod
    def _key(cls, text: str) -> str:
        raw_public(text)
        return text

    @field_validator("not_after")
    @classmethod
    def _aware(cls, at: datetime | None) -> datetime | None:
        if at is not None and at.tzinfo is None:
            raise ValueError("must name its time zone, e.g. 2026-12-01T00:00:00Z")
        return at


class TrustDocument(FileModel):
    keys: list[KeyEntry]


def raw_public(text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
        public_key(raw)
    except (binascii.Error, ValueError):
        raise ValueError("must be an Ed25519 public key: 32 bytes, in base64") from None
    return raw


@dataclass(frozen=True)
class ServiceKey:
    role: Role
    public: Ed25519PublicKey
    revoked: bool
    not_after: float | None  # epoch seconds


@dataclass(frozen=True)
class TrustFile:
    """The service keys a reader trusts, by key id."""

    keys: dict[str, ServiceKey]

    @classmethod
    def of(cls, document: TrustDocument) -> TrustFile:
        keys = {}
        for entry in document.keys:
            raw = raw_public(entry.public_key)
            keys[service_key_id(entry.role, raw)] = ServiceKey(
                entry.role,
                public_key(raw),
                entry.revoked,
                entry.not_after.timestamp() if entry.not_after is not None else None,
            )
        return cls(keys)


def load_trust(path: Path) -> TrustFile:
    """The trust file at ``path``; a ``ConfigError`` that names what is wrong in it."""
    document = load(TrustDocument, path)
    if not document.keys:
        raise ConfigError(f"{path}: keys: lists no key, so every record would be refused")
    return TrustFile.of(document)
