"""An order-independent digest of a set of facts, updated in O(1) per change.

The scheduler records a digest of its whole state with every decision; a
running sum of per-fact hashes (mod 2**256) keeps that cheap however large
the queue grows, and equal states give equal digests whatever the history.
"""

from __future__ import annotations

import hashlib

_MOD = 1 << 256


class Fingerprint:
    def __init__(self) -> None:
        self._sum = 0

    def add(self, fact: str) -> None:
        self._sum = (self._sum + _hash(fact)) % _MOD

    def remove(self, fact: str) -> None:
        self._sum = (self._sum - _hash(fact)) % _MOD

    def replace(self, old: str, new: str) -> None:
        if old != new:
            self.remove(old)
            self.add(new)

    def digest(self) -> bytes:
        return self._sum.to_bytes(32, "big")


def _hash(fact: str) -> int:
    return int.from_bytes(hashlib.blake2b(fact.encode(), digest_size=32).digest(), "big")
