"""An order-independent digest of a set of facts, updated in O(1) per change.

The scheduler records a digest of its whole state with every decision; a
running sum of per-fact hashes (mod 2**256) keeps that cheap however large
the queue grows, and equal states give equal digests whatever the history.
Facts are counted under a key (``put``, ``drop``) by the declared state
(``state.py``), which also defers hashing until the digest is read.
"""

from __future__ import annotations

import hashlib

_MOD = 1 << 256


class Fingerprint:
    def __init__(self) -> None:
        self._sum = 0
        self._keyed: dict[str, int] = {}  # key -> the hash of its fact, counted in the sum

    def add(self, fact: str) -> None:
        self._sum = (self._sum + _hash(fact)) % _MOD

    def remove(self, fact: str) -> None:
        self._sum = (self._sum - _hash(fact)) % _MOD

    def put(self, key: str, fact: str) -> None:
        """Count ``fact`` as the one fact under ``key``, in place of the one before."""
        new = _hash(fact)
        self._sum = (self._sum - self._keyed.get(key, 0) + new) % _MOD
        self._keyed[key] = new

    def drop(self, key: str) -> None:
        """Forget the fact under ``key``."""
        self._sum = (self._sum - self._keyed.pop(key, 0)) % _MOD

    def digest(self) -> bytes:
        return self._sum.to_bytes(32, "big")


def _hash(fact: str) -> int:
    return int.from_bytes(hashlib.blake2b(fact.encode(), digest_size=32).digest(), "big")
