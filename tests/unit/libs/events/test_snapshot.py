"""Snapshots (libs/events/snapshot.py): a loaded snapshot continues exactly as the
schedulers it was taken from, and nothing but a faithful snapshot of the same policy
loads."""

from __future__ import annotations

import pickle
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from qm.v1 import events_pb2, snapshot_pb2

from libs.core import PolicyConfig
from libs.events import encode
from libs.events import snapshot as snapshots
from libs.events.log_step import PartitionSchedulers
from libs.events.logfile import read_log
from libs.events.snapshot import SnapshotError, restore, take

GOLDEN = Path(__file__).resolve().parents[3] / "golden"
LOGS = sorted(p for p in GOLDEN.glob("*.input.bin"))
T = datetime(2026, 12, 4, tzinfo=UTC)


def decided(schedulers: PartitionSchedulers, log: list[events_pb2.Envelope], start: int) -> bytes:
    return b"".join(
        encode(out)
        for offset, env in enumerate(log[start:], start)
        for out in schedulers.decide(env, partition=0, offset=offset)
    )


def folded(log: list[events_pb2.Envelope], upto: int) -> PartitionSchedulers:
    schedulers = PartitionSchedulers(PolicyConfig())
    for offset, env in enumerate(log[:upto]):
        schedulers.decide(env, partition=0, offset=offset)
    return schedulers


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name.split(".")[0])
def test_a_restored_snapshot_decides_the_rest_of_the_log_byte_for_byte(path: Path) -> None:
    log = list(read_log(path))
    for cut in sorted({1, len(log) // 3, len(log) // 2, len(log) - 1}):
        snapshot = take(folded(log, cut), partition=0, next_offset=cut, taken_at=T)
        wire = snapshot_pb2.PlacementSnapshot.FromString(snapshot.SerializeToString())
        restored = restore(wire, PolicyConfig())
        assert decided(restored, log, cut) == decided(folded(log, cut), log, cut)


def test_a_snapshot_records_where_it_was_taken_and_under_what() -> None:
    log = list(read_log(LOGS[0]))
    snapshot = take(folded(log, 5), partition=2, next_offset=5, taken_at=T)
    assert (snapshot.input_partition, snapshot.next_offset) == (2, 5)
    assert snapshot.taken_at.ToDatetime(UTC) == T
    assert set(snapshot.state_digests) == {env.cluster for env in log[:5]}


def _snapshot() -> snapshot_pb2.PlacementSnapshot:
    return take(folded(list(read_log(LOGS[0])), 8), partition=0, next_offset=8, taken_at=T)


def test_other_knobs_or_another_version_fold_the_log_instead() -> None:
    with pytest.raises(SnapshotError, match="other knobs"):
        restore(_snapshot(), PolicyConfig(serving_linger_s=99))
    older = _snapshot()
    older.policy_version -= 1
    with pytest.raises(SnapshotError, match="policy"):
        restore(older, PolicyConfig())
    unknown = _snapshot()
    unknown.format = 99
    with pytest.raises(SnapshotError, match="format 99"):
        restore(unknown, PolicyConfig())


class _Shell:
    def __reduce__(self) -> tuple[object, ...]:
        import os

        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (zlib.compress(pickle.dumps({"c": _Shell()})), "names posix.system"),
        (zlib.compress(pickle.dumps({"c": 1})), "not a scheduler per cluster"),
        (zlib.compress(b"\x80\x05garbage"), "does not load"),
        (b"not zlib", "does not decompress"),
        (zlib.compress(b"\0" * 4097, 9), "over 4096 bytes"),
    ],
    ids=["code", "not-schedulers", "garbled", "not-compressed", "bomb"],
)
def test_a_hostile_or_damaged_state_is_refused_before_it_runs(
    state: bytes, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshots, "MAX_STATE_BYTES", 4096)
    snapshot = _snapshot()
    snapshot.state = state
    with pytest.raises(SnapshotError, match=reason):
        restore(snapshot, PolicyConfig())


def test_a_state_that_does_not_hash_to_its_digest_is_refused() -> None:
    snapshot = _snapshot()
    [cluster] = snapshot.state_digests
    snapshot.state_digests[cluster] = b"\0" * 32
    with pytest.raises(SnapshotError, match="does not hash"):
        restore(snapshot, PolicyConfig())
