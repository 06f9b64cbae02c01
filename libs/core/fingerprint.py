"""An order-independent digest of a set of facts, updated in O(1) per change.

The scheduler records a digest of its whole state with every decision; a
running sum of per-fact hashes (mod 2**256) keeps that cheap however large
the queue grows, and equal states give equal digests whatever the history.

A fact that is large and changes often (a workflow's progress, a GPU's queue)
is kept under a key and ``defer``-red: it is written out only when the digest
is read, so an input that changes it many times, or inputs that decide
nothing, pay for it once or not at all. The digest depends only on the facts
counted when it is read, so deferring never changes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

_MOD = 1 << 256


class Fingerprint:
    def __init__(self) -> None:
        self._sum = 0
        self._keyed: dict[str, int] = {}  # key -> the hash of its fact, counted in the sum
        self._deferred: dict[str, Callable[[], str]] = {}  # key -> writes its fact out

    def add(self, fact: str) -> None:
        self._sum = (self._sum + _hash(fact)) % _MOD

    def remove(self, fact: str) -> None:
        self._sum = (self._sum - _hash(fact)) % _MOD

    def replace(self, old: str, new: str) -> None:
        if old != new:
            self.remove(old)
            self.add(new)

    def put(self, key: str, fact: str) -> None:
        """Count ``fact`` as the one fact under ``key``, in place of the one before."""
        self._deferred.pop(key, None)
        new = _hash(fact)
        self._sum = (self._sum - self._keyed.get(key, 0) + new) % _MOD
        self._keyed[key] = new

    def defer(self, key: str, fact: Callable[[], str]) -> None:
        """``put(key, fact())`` when the digest is next read. Whatever ``fact`` reads
        must not change before then unless ``defer`` is called again for ``key``."""
        self._deferred[key] = fact

    def drop(self, key: str) -> None:
        """Forget the fact under ``key``, deferred or counted."""
        self._deferred.pop(key, None)
        self._sum = (self._sum - self._keyed.pop(key, 0)) % _MOD

    def digest(self) -> bytes:
        while self._deferred:
            key, fact = self._deferred.popitem()
            self.put(key, fact())
        return self._sum.to_bytes(32, "big")


def _hash(fact: str) -> int:
    return int.from_bytes(hashlib.blake2b(fact.encode(), digest_size=32).digest(), "big")
