"""Nodes' keys as operators approved them on the log (``NodeApproved``, ``NodeRevoked``).

The scheduler keeps them with the rest of its state, so a snapshot, a standby and an
audit replay know them at every offset exactly as placement did; the gate in front of
the fold (``libs/trust/gate.py``) checks each node's records against them.
"""

from __future__ import annotations

from dataclasses import dataclass

ED25519_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class ApprovedKey:
    """A node's approved Ed25519 public key; ``revoked`` once an operator revoked it."""

    public_key: bytes
    revoked: bool = False

    def fact(self) -> str:
        return self.public_key.hex() + (" revoked" if self.revoked else "")
