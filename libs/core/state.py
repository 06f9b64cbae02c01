"""Declared state: everything the core remembers, in named tables and cells that
keep the state digest themselves.

A scheduler declares each piece of what it remembers once, as a ``Table`` (keyed
facts) or a ``Cell`` (one value), in its ``State``. Every write goes through
them, so the digest covers the state by construction: there is no second,
hand-kept list of facts to forget a field in. A write only marks its key, so a
hot path pays a dict write and a key written many times is hashed once: the
marked facts are hashed when the digest is read (placement reads it for inputs
that decide something, the audit likewise), so inputs that decide nothing, and
the simulator, which never reads it, do not pay for them.

A table's order is state too (the oldest lease expires first, a workflow GPU
is chosen in node order): each entry's fact holds its place, the count of
entries inserted into the table before it, so a replay that agrees on the
digest agrees on every order the scheduler reads.

Values should be immutable (frozen dataclasses, tuples): a value changed in
place is seen by the digest only after ``touch``. ``State.recomputed`` hashes
every fact afresh, so tests can hold the incremental digest to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from libs.core.fingerprint import Fingerprint, fact_hash

K = TypeVar("K")
V = TypeVar("V")


class State:
    """The named tables and cells of one scheduler, and their digest."""

    def __init__(self) -> None:
        self._fingerprint = Fingerprint()
        self._parts: dict[str, Table[object, object] | Cell[object]] = {}
        self._marked: list[Table[object, object] | Cell[object]] = []  # hashed on digest

    def table(self, name: str, fact: Callable[[V], str] = repr) -> Table[K, V]:
        table: Table[K, V] = Table(self, name, fact)
        self._declare(name, table)
        return table

    def cell(self, name: str, value: V, fact: Callable[[V], str] = repr) -> Cell[V]:
        cell = Cell(self, name, value, fact)
        self._declare(name, cell)
        return cell

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._parts)

    def digest(self) -> bytes:
        """The digest of every declared fact, hashing only those written since."""
        while self._marked:
            self._marked.pop()._flush(self._fingerprint)
        return self._fingerprint.digest()

    def recomputed(self) -> bytes:
        """The digest hashed from scratch over every fact (for tests: slow)."""
        fingerprint = Fingerprint()
        for part in self._parts.values():
            for fact in part.facts():
                fingerprint.add(fact)
        return fingerprint.digest()

    def _declare(self, name: str, part: object) -> None:
        if name in self._parts:
            raise ValueError(f"state {name!r} is declared twice")
        self._parts[name] = part  # type: ignore[assignment]

    def _mark(self, part: object) -> None:
        self._marked.append(part)  # type: ignore[arg-type]


class Table(dict[K, V]):
    """A named mapping whose entries are facts in the digest, in insertion order.

    Reads are a dict's own (the hot paths read far more than they write); the
    writes a table does not count (``update``, ``clear``...) are refused.
    """

    __slots__ = (
        "_fact",
        "_hashes",
        "_inserted",
        "_marked",
        "_places",
        "_state",
        "name",
    )

    def __init__(self, state: State, name: str, fact: Callable[[V], str]) -> None:
        super().__init__()
        self.name = name
        self._state = state
        self._fact = fact
        self._places: dict[K, int] = {}  # key -> its place in the order (see the module)
        self._inserted = 0
        self._marked: set[K] = set()
        self._hashes: dict[K, int] = {}  # key -> the hash of its fact, counted in the digest

    def first(self) -> tuple[K, V]:
        """The entry written first (of those still here)."""
        return next(iter(self.items()))

    # -- writing ---------------------------------------------------------------

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:  # a new key goes last, as in a dict
            self._places[key] = self._inserted
            self._inserted += 1
        dict.__setitem__(self, key, value)
        marked = self._marked  # touch(key), inline: the hot paths write here
        if not marked:
            self._state._mark(self)
        marked.add(key)

    def __delitem__(self, key: K) -> None:
        dict.__delitem__(self, key)
        del self._places[key]
        self.touch(key)

    def pop(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        if key not in self:
            return default
        self.touch(key)
        del self._places[key]
        return dict.pop(self, key)

    def setdefault(self, key: K, value: V) -> V:
        if key not in self:
            self[key] = value
        return self[key]

    def touch(self, key: K) -> None:
        """The entry under ``key`` changed (in place, or was written): rehash it."""
        if not self._marked:
            self._state._mark(self)
        self._marked.add(key)

    def _refused(self, *args: object, **kwargs: object) -> None:
        raise TypeError(f"table {self.name}: write entries one by one")

    update = clear = popitem = __ior__ = _refused  # type: ignore[assignment]

    # -- snapshots (libs/events/snapshot.py) ----------------------------------------

    def __reduce__(self) -> tuple[object, ...]:
        # Entries travel in the state, not as dict items: pickle would set those
        # through __setitem__ before the slots exist, and each set would move a place.
        slots = {name: getattr(self, name) for name in Table.__slots__}
        return (_empty_table, (type(self),), (slots, list(dict.items(self))))

    def __setstate__(self, state: tuple[dict[str, object], list[tuple[K, V]]]) -> None:
        slots, entries = state
        for name, value in slots.items():
            object.__setattr__(self, name, value)
        for key, value in entries:
            dict.__setitem__(self, key, value)

    # -- the digest --------------------------------------------------------------

    def facts(self) -> Iterator[str]:
        for key, value in self.items():
            yield f"{self.name}|{key}|{self._places[key]}|{self._fact(value)}"

    def _flush(self, fingerprint: Fingerprint) -> None:
        name, places, fact, hashes = self.name, self._places, self._fact, self._hashes
        delta = 0
        for key in self._marked:
            delta -= hashes.pop(key, 0)
            if key in self:
                new = hashes[key] = fact_hash(f"{name}|{key}|{places[key]}|{fact(self[key])}")
                delta += new
        fingerprint.shift(delta)
        self._marked.clear()


class Cell(Generic[V]):
    """A named value that is one fact in the digest."""

    __slots__ = ("_fact", "_hash", "_marked", "_state", "_value", "name")

    def __init__(self, state: State, name: str, value: V, fact: Callable[[V], str]) -> None:
        self.name = name
        self._state = state
        self._fact = fact
        self._value = value
        self._marked = False
        self._hash = 0  # of its fact, counted in the digest
        self.touch()

    @property
    def value(self) -> V:
        return self._value

    @value.setter
    def value(self, value: V) -> None:
        self._value = value
        self.touch()

    def touch(self) -> None:
        if not self._marked:
            self._marked = True
            self._state._mark(self)

    def facts(self) -> Iterator[str]:
        yield f"{self.name}|{self._fact(self._value)}"

    def _flush(self, fingerprint: Fingerprint) -> None:
        new = fact_hash(f"{self.name}|{self._fact(self._value)}")
        fingerprint.shift(new - self._hash)
        self._hash = new
        self._marked = False


def _empty_table(kind: type[Table[K, V]]) -> Table[K, V]:
    """A table with nothing set yet, for ``Table.__setstate__`` to fill."""
    return dict.__new__(kind)
