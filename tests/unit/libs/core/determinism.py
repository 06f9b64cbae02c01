"""The determinism checker: the same inputs must give the same decisions, byte for byte.

A run is recorded as its inputs and, for each input, one line of bytes: the
decisions it caused, serialized canonically (every field, in order), and the
state digest after it. :func:`check_determinism` drives a history twice from
scratch, replays the first run's recorded inputs into a fresh scheduler, and,
optionally, replays them in other processes started with another
``PYTHONHASHSEED`` (:class:`OtherProcess`), the only way a dependence on set or
dict-of-str iteration order can show: inside one process, hash order repeats.
It returns the first :class:`Divergence`, or None.

Plants (:data:`PLANTS`) are deliberate nondeterminism for the tests of the
checker itself; the worker (``python -m tests.unit.libs.core.determinism``)
installs one when asked.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import pickle
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from libs.core import Decision, Input, PolicyConfig, Scheduler
from libs.core import charges as charges_module
from libs.core import fairshare as fairshare_module
from libs.core.budget_tree import BudgetTree

REPO = Path(__file__).resolve().parents[4]
Stream = tuple[bytes, ...]


# -- recording -----------------------------------------------------------------


def _plain(value: object) -> object:
    """A JSON-able form that keeps every field and every order as it is."""
    if isinstance(value, float):
        return {"float": repr(value)}  # exact, and NaN and infinities too
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, enum.Enum):
        return {type(value).__name__: _plain(value.value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            type(value).__name__: [
                [f.name, _plain(getattr(value, f.name))]
                for f in dataclasses.fields(value)
                if f.compare
            ]
        }
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[_plain(k), _plain(v)] for k, v in value.items()]}
    # A set has no order of its own: writing it out would follow hash randomization.
    raise TypeError(f"cannot serialize {type(value).__name__} deterministically")


def line(decisions: Sequence[Decision], digest: bytes) -> bytes:
    """One input's outcome as bytes: its decisions in order, then the state digest."""
    body = {"decisions": [_plain(d) for d in decisions], "digest": digest.hex()}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Recording:
    inputs: tuple[Input, ...]
    stream: Stream  # one line per input


def record(scheduler: Scheduler, inputs: Sequence[Input]) -> Recording:
    """Feed ``inputs`` to ``scheduler`` and record what each caused."""
    lines = []
    for event in inputs:
        decisions = scheduler.handle(event)
        lines.append(line(decisions, scheduler.digest()))
    return Recording(tuple(inputs), tuple(lines))


def replay(inputs: Sequence[Input], config: PolicyConfig | None = None) -> Stream:
    """The stream a fresh scheduler makes of recorded inputs."""
    return record(Scheduler(config), inputs).stream


# -- comparing -----------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    step: int  # index of the input whose outcome differs
    input: str
    expected: tuple[str, bytes]  # (which run, its line)
    actual: tuple[str, bytes]

    def __str__(self) -> str:
        (left, mine), (right, theirs) = self.expected, self.actual
        return (
            f"input {self.step} ({self.input[:200]}): {left} and {right} differ\n"
            f"  {left}: {mine[:600]!r}\n  {right}: {theirs[:600]!r}"
        )


MISSING = b"<no such input>"


def first_divergence(
    streams: Mapping[str, Sequence[bytes]], inputs: Sequence[Input] = ()
) -> Divergence | None:
    """The earliest input at which any stream differs from the first one."""
    (reference, expected), *others = streams.items()
    found: Divergence | None = None
    for name, actual in others:
        for step in range(max(len(expected), len(actual))):
            if found is not None and step >= found.step:
                break
            mine = expected[step] if step < len(expected) else MISSING
            theirs = actual[step] if step < len(actual) else MISSING
            if mine != theirs:
                shown = repr(inputs[step]) if step < len(inputs) else "?"
                found = Divergence(step, shown, (reference, mine), (name, theirs))
                break
    return found


class Replayer(Protocol):
    name: str

    def replay(self, inputs: Sequence[Input]) -> Stream: ...


def check_determinism(
    drive: Callable[[], Recording], *, elsewhere: Sequence[Replayer] = ()
) -> Divergence | None:
    """Drive a history twice from scratch and replay the first run's inputs, here
    and in each of ``elsewhere``: the first divergence of any from the first run."""
    first, second = drive(), drive()
    streams: dict[str, Sequence[bytes]] = {
        "first run": first.stream,
        "second run": second.stream,
        "replay": replay(first.inputs),
    }
    for other in elsewhere:
        streams[other.name] = other.replay(first.inputs)
    return first_divergence(streams, first.inputs)


# -- another process, another hash seed -----------------------------------------


def other_hash_seed(seed: int = 1) -> int:
    """``seed``, or the next one if this process happens to run with it."""
    return seed + 1 if os.environ.get("PYTHONHASHSEED") == str(seed) else seed


class OtherProcess:
    """A worker process with its own ``PYTHONHASHSEED`` that replays inputs on request."""

    def __init__(self, hash_seed: int, plant: str = "") -> None:
        self.name = f"replay with PYTHONHASHSEED={hash_seed}" + (f" ({plant})" if plant else "")
        command = [sys.executable, "-m", "tests.unit.libs.core.determinism"]
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "QM_DETERMINISM_PLANT": plant}
        self._process = subprocess.Popen(
            command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def replay(self, inputs: Sequence[Input]) -> Stream:
        assert self._process.stdin is not None and self._process.stdout is not None
        _send(self._process.stdin, tuple(inputs))
        stream = _receive(self._process.stdout)
        assert isinstance(stream, tuple), f"the worker failed: {stream!r}"
        return stream

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)
        if self._process.stdout is not None:
            self._process.stdout.close()


def _send(pipe: IO[bytes], value: object) -> None:
    data = pickle.dumps(value)
    pipe.write(struct.pack(">Q", len(data)) + data)
    pipe.flush()


def _receive(pipe: IO[bytes]) -> object:
    header = pipe.read(8)
    if len(header) < 8:
        raise EOFError("the worker is gone")
    (size,) = struct.unpack(">Q", header)
    return pickle.loads(pipe.read(size))


def _serve(plant: str) -> None:
    if plant:
        charges_module.leaf_order = PLANTS[plant]()  # type: ignore[attr-defined, assignment]
    while True:
        try:
            inputs = _receive(sys.stdin.buffer)
        except EOFError:
            return
        try:
            result: object = replay(inputs)  # type: ignore[arg-type]
        except Exception as exc:  # report it, as a test failure on the other side
            result = f"{type(exc).__name__}: {exc}"
        _send(sys.stdout.buffer, result)


# -- plants: deliberate nondeterminism, to show the checker catches it -------------

LeafOrder = Callable[[BudgetTree, Mapping[str, float], Mapping[str, float] | None], list[str]]


def _tie_broken_by(tie_break: Callable[[list[str]], Mapping[str, float]]) -> LeafOrder:
    """Fair-share order of a flat tree whose ties go by ``tie_break`` instead of by name."""

    def leaf_order(
        tree: BudgetTree,
        usage: Mapping[str, float],
        entitlements: Mapping[str, float] | None = None,
    ) -> list[str]:
        leaves = fairshare_module.leaf_order(tree, usage, entitlements)
        position = tie_break(leaves)
        return sorted(leaves, key=lambda k: (usage.get(k, 0.0) / tree.weight(k), position[k]))

    return leaf_order


def tie_broken_at_random(seed: int = 2024) -> LeafOrder:
    """Ties in random order, from one seeded generator shared by every run."""
    rng = random.Random(seed)
    return _tie_broken_by(lambda leaves: {k: rng.random() for k in leaves})


def tie_broken_by_hash_order() -> LeafOrder:
    """Ties in the iteration order of a set of str: fixed within a process, not across."""
    return _tie_broken_by(lambda leaves: {k: i for i, k in enumerate(set(leaves))})


PLANTS: dict[str, Callable[[], LeafOrder]] = {
    "random tie-break": tie_broken_at_random,
    "hash-order tie-break": tie_broken_by_hash_order,
}


if __name__ == "__main__":
    _serve(os.environ.get("QM_DETERMINISM_PLANT", ""))
