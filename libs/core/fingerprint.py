"""An order-independent digest of a set of facts, updated in O(1) per change.

The scheduler records a digest of its whole state with every decision; a
running sum of per-fact hashes (mod 2**256) keeps that cheap however large
the queue grows, and equal states give equal digests whatever the history.
The declared state (``state.py``) keeps the hash of each of its facts and
moves the sum by the difference when a fact changes (``shift``).
"""

from __future__ import annotations

import hashlib

_MOD = 1 << 256


class Fingerprint:
    def __init__(self) -> None:
        self._sum = 0

    def add(self, fact: str) -> None:
        self._sum = (self._sum + fact_hash(fact)) % _MOD

    def remove(self, fact: str) -> None:
        self._sum = (self._sum - fact_hash(fact)) % _MOD

    def shift(self, delta: int) -> None:
        """Move the sum by ``delta``: the hashes of facts counted less those uncounted."""
        self._sum = (self._sum + delta) % _MOD

    def digest(self) -> bytes:
        return self._sum.to_bytes(32, "big")


# Copying a fresh hasher is cheaper than making one with its parameters each time,
# and the digest reads as many hashes as facts were written.
_BLAKE2B_256 = hashlib.blake2b(digest_size=32)


def fact_hash(fact: str) -> int:
    hasher = _BLAKE2B_256.copy()
    hasher.update(fact.encode())
    return int.from_bytes(hasher.digest(), "big")
