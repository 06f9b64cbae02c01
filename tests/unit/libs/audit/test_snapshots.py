"""The audit and placement's snapshots: a replay from the start checks a snapshot at
its offset; a replay from a snapshot checks only what follows it, and as well."""

from __future__ import annotations

from datetime import UTC, datetime

from qm.v1 import events_pb2

from libs.audit import Replay
from libs.core import PolicyConfig
from libs.events import event_type
from libs.events.log_step import PartitionSchedulers
from libs.events.logfile import read_log
from libs.events.snapshot import restore, take
from tests.golden.record import HERE

INPUTS = list(read_log(HERE / "serving-mixed.input.bin"))
RECORDED = list(read_log(HERE / "serving-mixed.decisions.bin"))
CUT = len(INPUTS) // 2


def snapshot_at(cut: int) -> tuple[int, dict[str, bytes], PartitionSchedulers]:
    schedulers = PartitionSchedulers(PolicyConfig())
    for offset, env in enumerate(INPUTS[:cut]):
        schedulers.decide(env, partition=0, offset=offset)
    taken = take(schedulers, partition=0, next_offset=cut, taken_at=datetime.now(UTC))
    return cut, dict(taken.state_digests), restore(taken, PolicyConfig())


def replayed(
    replay: Replay, inputs: list[events_pb2.Envelope], recorded: list[events_pb2.Envelope]
) -> Replay:
    for offset, env in enumerate(inputs):
        replay.feed_input(0, offset, env)
    for env in recorded:
        replay.feed_recorded(env)
    return replay


def test_a_replay_from_the_start_checks_the_snapshot_at_its_offset() -> None:
    offset, digests, _ = snapshot_at(CUT)
    replay = Replay()
    replay.check_snapshot(0, offset, digests)
    result = replayed(replay, INPUTS, RECORDED).finish()
    assert result.ok and [(c.partition, c.offset, c.ok) for c in result.snapshots] == [
        (0, CUT, True)
    ]
    forged = Replay()
    forged.check_snapshot(0, offset, {cluster: b"\0" * 32 for cluster in digests})
    result = replayed(forged, INPUTS, RECORDED).finish()
    assert not result.ok and result.snapshots[0].differing == tuple(sorted(digests))
    assert result.divergence is None  # every decision reproduced: only the snapshot lies


def test_a_replay_from_a_snapshot_checks_what_follows_it() -> None:
    offset, _, schedulers = snapshot_at(CUT)
    replay = Replay()
    replay.start_from(0, offset, schedulers)
    result = replayed(replay, INPUTS, RECORDED).finish()
    assert result.ok and result.started_from == ((0, CUT),)
    assert result.inputs == len(INPUTS) - CUT
    after = sum(
        1
        for env in RECORDED
        if event_type(env) != "policy_configured"
        and getattr(env, event_type(env)).provenance.input_offset >= CUT
    )
    assert result.checked == result.reproduced == after > 0


def test_a_replay_from_a_snapshot_still_finds_a_divergence_after_it() -> None:
    offset, _, schedulers = snapshot_at(CUT)
    dropped = len(RECORDED) - 10  # a decision after the snapshot goes missing from the log
    replay = Replay()
    replay.start_from(0, offset, schedulers)
    result = replayed(replay, INPUTS, RECORDED[:dropped] + RECORDED[dropped + 1 :]).finish()
    assert result.divergence is not None and result.divergence.input_offset >= CUT
