"""``python -m tests.perf.phases MODULE [ARGS]``: run a service with wall-clock timers.

Wraps the seams every service goes through (aiokafka polls, offset lookups and
commits, sends, transactions; placement's ``decide``; admission's handler; the node
agent's per-decision handling) with ``perf_counter`` timers, then runs
``MODULE.main()``. The cost is a clock read per call. On SIGUSR1 it writes one line
``QM-PHASES {json}`` with the totals so far (label -> [calls, seconds, max seconds]);
the live benchmark signals at the start and the end of its window and diffs the two.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

TOTALS: dict[str, list[float]] = {}
MARKER = "QM-PHASES "

# (module, attribute path, label): what is timed where it exists.
SEAMS = (
    ("aiokafka", "AIOKafkaConsumer.getmany", "kafka poll (incl. waiting for input)"),
    ("aiokafka", "AIOKafkaConsumer.position", "kafka position"),
    ("aiokafka", "AIOKafkaConsumer.committed", "kafka committed (OffsetFetch)"),
    ("aiokafka", "AIOKafkaConsumer.commit", "kafka commit offsets"),
    ("aiokafka", "AIOKafkaProducer.send", "kafka enqueue record"),
    ("aiokafka", "AIOKafkaProducer.begin_transaction", "txn begin"),
    ("aiokafka", "AIOKafkaProducer.send_offsets_to_transaction", "txn send offsets"),
    ("aiokafka", "AIOKafkaProducer.commit_transaction", "txn commit"),
    ("libs.bus.consumer", "EventConsumer.decode", "decode envelope"),
    ("libs.bus.producer", "EventProducer.send", "send + wait ack"),
    (
        "services.placement.service",
        "PlacementService.outputs",
        "decide (core + digest + envelopes)",
    ),
    ("services.placement.service", "PlacementService._commit", "batch (whole transaction)"),
    ("services.admission.servicer", "JobServicer.SubmitJob", "SubmitJob handler"),
    ("services.admission.servicer", "JobServicer._record", "record events + acks"),
    ("services.node_agent.agent", "NodeAgent.handle", "agent handle decision"),
)


def _add(label: str, seconds: float) -> None:
    entry = TOTALS.setdefault(label, [0, 0.0, 0.0])
    entry[0] += 1
    entry[1] += seconds
    entry[2] = max(entry[2], seconds)


def _timed(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):
        coro_fn: Callable[..., Awaitable[Any]] = original

        @functools.wraps(original)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await coro_fn(*args, **kwargs)
            finally:
                _add(label, time.perf_counter() - start)

        return timed_async

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _add(label, time.perf_counter() - start)

    return timed


def install() -> list[str]:
    """Wrap every seam that exists; return the labels wrapped."""
    wrapped = []
    for module_name, path, label in SEAMS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        original = getattr(owner, name, None) if owner is not None else None
        if callable(original):
            setattr(owner, name, _timed(label, original))
            wrapped.append(label)
    return wrapped


def _snapshot(signum: int, frame: FrameType | None) -> None:
    line = MARKER + json.dumps({"t": time.time(), "totals": TOTALS}) + "\n"
    os.write(sys.stdout.fileno(), line.encode())


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tests.perf.phases MODULE [ARGS]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    install()
    signal.signal(signal.SIGUSR1, _snapshot)
    result = importlib.import_module(module).main()
    raise SystemExit(result if isinstance(result, int) else 0)


def diff(first: dict[str, list[float]], last: dict[str, list[float]]) -> dict[str, list[float]]:
    """Totals accrued between two snapshots."""
    out = {}
    for label, (calls, seconds, peak) in last.items():
        before = first.get(label, [0, 0.0, 0.0])
        out[label] = [calls - before[0], seconds - before[1], peak]
    return out


def read_snapshots(log: str) -> list[tuple[float, dict[str, list[float]]]]:
    snapshots = []
    for line in log.splitlines():
        if line.startswith(MARKER):
            data = json.loads(line.removeprefix(MARKER))
            snapshots.append((float(data["t"]), data["totals"]))
    return snapshots


if __name__ == "__main__":
    main()
