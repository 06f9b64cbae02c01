"""Placement snapshots: the schedulers of one input partition, frozen at an input offset.

A snapshot is a cache of the log, never a source of truth: the state it holds is a
pure function of the input records before ``next_offset``, so whoever loads one may
instead fold those records, and an auditor can check it by doing exactly that. It is
loaded only by a placement of the same policy, version and knobs, and only if every
cluster's state hashes, recomputed from scratch, to the digest recorded beside it;
otherwise :class:`SnapshotError` says why and the caller folds the log.

The state is pickled (the core's declared tables, caches and memos as they are, so a
loaded scheduler continues exactly as the original would). Snapshots are read from
the bus, so unpickling (:func:`unpack`, which the projector's ledger snapshots use too)
admits only the named packages' classes and a few plain builtins: a record that names
anything else is refused before it can run any code.
"""

from __future__ import annotations

import io
import pickle
import zlib
from collections.abc import Collection
from datetime import datetime

from qm.v1 import snapshot_pb2

from libs.core import POLICY, POLICY_VERSION, PolicyConfig, Scheduler, config_digest
from libs.events.log_step import InputGate, PartitionSchedulers

# The layout of ``state``: bump it when the pickled shape changes incompatibly.
# 2: the core's memos and indexes changed shape (queue heads per tier, the queues whose
# head moved, the room index, remembered prices): a format 1 state would load broken.
FORMAT = 2
# What a placement snapshot's state may name (packages, and everything below them).
CORE = ("libs.core",)
# Globals any snapshot may name besides its packages'.
_PLAIN = frozenset(
    {
        ("builtins", "repr"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("collections", "Counter"),
        ("collections", "OrderedDict"),
        ("collections", "deque"),
        ("collections", "defaultdict"),
    }
)
# Decompressed, a snapshot may not exceed this: a hostile record cannot exhaust memory.
MAX_STATE_BYTES = 2 << 30


class SnapshotError(Exception):
    """Why a snapshot cannot be loaded; the caller folds the log instead."""


def take(
    schedulers: PartitionSchedulers, *, partition: int, next_offset: int, taken_at: datetime
) -> snapshot_pb2.PlacementSnapshot:
    """The snapshot of ``schedulers`` having folded the partition's records before
    ``next_offset``."""
    snapshot = snapshot_pb2.PlacementSnapshot(
        input_partition=partition,
        next_offset=next_offset,
        policy=POLICY,
        policy_version=POLICY_VERSION,
        config_digest=config_digest(schedulers.config),
        format=FORMAT,
        state=pack(schedulers.by_cluster),
    )
    for cluster, scheduler in schedulers.by_cluster.items():
        snapshot.state_digests[cluster] = scheduler.digest()
    snapshot.taken_at.FromDatetime(taken_at)
    return snapshot


def key(partition: int) -> bytes:
    """The key of an input partition's snapshots on their compacted topic."""
    return str(partition).encode()


def restore(
    snapshot: snapshot_pb2.PlacementSnapshot, config: PolicyConfig, gate: InputGate | None = None
) -> PartitionSchedulers:
    """The schedulers ``snapshot`` holds, checked, to go on behind ``gate``; raises
    :class:`SnapshotError`."""
    if reason := incompatibility(snapshot, config):
        raise SnapshotError(reason)
    by_cluster = unpack(snapshot.state, CORE)
    if not isinstance(by_cluster, dict) or not all(
        isinstance(c, str) and isinstance(s, Scheduler) for c, s in by_cluster.items()
    ):
        raise SnapshotError("its state is not a scheduler per cluster")
    if set(by_cluster) != set(snapshot.state_digests):
        raise SnapshotError("its clusters are not those its digests name")
    for cluster, scheduler in by_cluster.items():
        recorded = snapshot.state_digests[cluster]
        if scheduler.digest() != recorded or scheduler.recomputed_digest() != recorded:
            raise SnapshotError(f"cluster {cluster!r}: its state does not hash to its digest")
    return PartitionSchedulers(config, by_cluster=by_cluster, gate=gate)


def incompatibility(snapshot: snapshot_pb2.PlacementSnapshot, config: PolicyConfig) -> str:
    """Why a placement running ``config`` may not load ``snapshot`` ('' if it may)."""
    if snapshot.format != FORMAT:
        return f"format {snapshot.format}; this placement reads format {FORMAT}"
    if (snapshot.policy, snapshot.policy_version) != (POLICY, POLICY_VERSION):
        return (
            f"taken by policy {snapshot.policy} v{snapshot.policy_version}; "
            f"this is {POLICY} v{POLICY_VERSION}"
        )
    if snapshot.config_digest != config_digest(config):
        return "taken under other knobs (config digest differs)"
    return ""


def pack(state: object) -> bytes:
    """``state`` pickled and compressed, as snapshots hold it."""
    return zlib.compress(pickle.dumps(state, protocol=5), 1)


def unpack(state: bytes, packages: Collection[str]) -> object:
    """What :func:`pack` made, naming nothing outside ``packages`` (and plain builtins);
    raises :class:`SnapshotError`."""
    raw = _inflate(state)
    try:
        return _Restricted(io.BytesIO(raw), tuple(packages)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # a truncated or garbled pickle: any of a dozen kinds
        raise SnapshotError(f"its state does not load: {type(exc).__name__}: {exc}") from None


def _inflate(state: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(state, MAX_STATE_BYTES)
    except zlib.error as exc:
        raise SnapshotError(f"its state does not decompress: {exc}") from None
    if inflater.unconsumed_tail:
        raise SnapshotError(f"its state decompresses to over {MAX_STATE_BYTES} bytes")
    return raw


class _Restricted(pickle.Unpickler):
    """Loads the named packages' classes and plain builtins only (Python's "restricting
    globals"); dunder paths are refused so no name can reach a module's globals."""

    def __init__(self, file: io.BytesIO, packages: tuple[str, ...]) -> None:
        super().__init__(file)
        self._packages = packages

    def find_class(self, module: str, name: str) -> object:
        allowed = any(module == p or module.startswith(p + ".") for p in self._packages)
        if "__" in name or not (allowed or (module, name) in _PLAIN):
            raise SnapshotError(f"its state names {module}.{name}, which snapshots may not")
        return super().find_class(module, name)
