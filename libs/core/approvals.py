"""Nodes' keys as operators approved them on the log (``NodeApproved``, ``NodeRevoked``).

The scheduler keeps them with the rest of its state, so a snapshot, a standby and an
audit replay know them at every offset exactly as placement did; the gate in front of
the fold (``libs/trust/gate.py``) checks each node's records against them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ED25519_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class ApprovedKey:
    """A node's approved Ed25519 public key; ``revoked`` once an operator revoked it."""

    public_key: bytes
    revoked: bool = False

    def fact(self) -> str:
        return self.public_key.hex() + (" revoked" if self.revoked else "")


def approved(public_key: bytes) -> ApprovedKey | None:
    """The key an approval makes a node's, replacing any (revoked or not); None for one
    that is no Ed25519 key, which changes nothing. Every reader folds approvals so."""
    return ApprovedKey(public_key) if len(public_key) == ED25519_KEY_BYTES else None


def revoked(current: ApprovedKey | None) -> ApprovedKey | None:
    """The node's key once revoked; None when it has none, which changes nothing."""
    return replace(current, revoked=True) if current is not None else None
