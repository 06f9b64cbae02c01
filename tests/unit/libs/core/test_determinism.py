"""The determinism checker can fail: planted nondeterminism is reported.

``determinism.check_determinism`` is what the properties in ``test_properties.py``
run over generated histories. Here it meets a fixed history of ties (six
allocations with equal shares, a job each, nodes joining one at a time, so each
join places the job of whichever allocation ranks first) with one tie-break in
the scheduler planted to go at random (seeded) or by hash order.
"""

from __future__ import annotations

import math

import pytest

from libs.core import BudgetSet, Input, JobArrived, NodeJoined, Place, Scheduler, Wait
from libs.core import charges as charges_module
from libs.core.wait_reasons import WaitCode, WaitReason
from tests.builders import job, node, tree
from tests.unit.libs.core.determinism import (
    MISSING,
    OtherProcess,
    Recording,
    check_determinism,
    first_divergence,
    line,
    record,
    tie_broken_at_random,
    tie_broken_by_hash_order,
)

TEAMS = ("p", "q", "r", "s", "t", "u")
TIES: tuple[Input, ...] = (
    BudgetSet(0, tree(**dict.fromkeys(TEAMS, 1.0))),
    *(JobArrived(0, f"job-{team}", job(8, allocation=team, min_runtime_s=3600)) for team in TEAMS),
    *(NodeJoined(10, node(f"n{i}", 8)) for i in range(len(TEAMS))),
)


def drive() -> Recording:
    return record(Scheduler(), TIES)


def placed(scheduler: Scheduler) -> list[str]:
    return [d.job_id for event in TIES for d in scheduler.handle(event) if isinstance(d, Place)]


def test_without_a_plant_the_ties_go_by_name_and_nothing_diverges(
    other_process: OtherProcess,
) -> None:
    assert placed(Scheduler()) == [f"job-{team}" for team in TEAMS]
    assert check_determinism(drive, elsewhere=[other_process]) is None


def test_the_checker_reports_a_tie_broken_at_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charges_module, "leaf_order", tie_broken_at_random(seed=2024))
    divergence = check_determinism(drive)
    assert divergence is not None
    # The arrivals only wait; the first node that joins places a different job.
    assert divergence.step == 1 + len(TEAMS)
    assert divergence.input.startswith("NodeJoined(")
    # Which run draws other ties first depends on how often the order is asked for.
    assert divergence.expected[0] == "first run"
    assert divergence.actual[0] in ("second run", "replay")
    assert divergence.expected[1] != divergence.actual[1]
    assert f"first run and {divergence.actual[0]} differ" in str(divergence)


def test_the_checker_reports_a_tie_broken_by_hash_order_only_across_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(charges_module, "leaf_order", tie_broken_by_hash_order())
    # In one process the hash order repeats: runs and replays agree.
    assert check_determinism(drive) is None
    # Processes with other hash seeds (fixed ones: the test is deterministic) do not.
    workers = [OtherProcess(1, "hash-order tie-break"), OtherProcess(2, "hash-order tie-break")]
    try:
        divergence = check_determinism(drive, elsewhere=workers)
        one, two = (w.replay(TIES) for w in workers)
    finally:
        for worker in workers:
            worker.close()
    assert one != two
    assert divergence is not None
    assert divergence.step >= 1 + len(TEAMS)
    assert divergence.input.startswith("NodeJoined(")
    assert "PYTHONHASHSEED" in divergence.actual[0]


# -- the pieces of the checker ---------------------------------------------------


def test_a_line_holds_every_decision_field_and_the_digest_exactly() -> None:
    spec = job(1, simulated_duration_s=0.1 + 0.2)
    why = WaitReason.of(WaitCode.IN_LINE, ahead=1)
    encoded = line([Place("j", "j/0", "n0", (0,), spec), Wait("k", why)], b"\x01\xff")
    assert b'"digest":"01ff"' in encoded
    assert b'{"float":"0.30000000000000004"}' in encoded  # not rounded
    assert b'["code","in_line"],["fields",[["ahead","1"]]]' in encoded
    ahead = WaitReason.of(WaitCode.IN_LINE, ahead=2)
    assert line([Wait("k", why)], b"") != line([Wait("k", ahead)], b"")
    assert b'{"float":"nan"}' in line(
        [Place("j", "j/0", "n", (0,), job(1, min_gpu_memory_gib=math.nan))], b""
    )


def test_a_set_in_a_decision_is_refused_rather_than_written_in_hash_order() -> None:
    with pytest.raises(TypeError, match="set"):
        line([Wait("k", WaitReason(WaitCode.IN_LINE, {"a", "b"}))], b"")  # type: ignore[arg-type]


def test_the_earliest_divergence_of_any_stream_is_reported() -> None:
    streams = {
        "first": (b"a", b"b", b"c", b"d"),
        "late": (b"a", b"b", b"c", b"x"),
        "early": (b"a", b"y", b"c", b"d"),
        "same": (b"a", b"b", b"c", b"d"),
    }
    divergence = first_divergence(streams)
    assert divergence is not None
    assert (divergence.step, divergence.expected, divergence.actual) == (
        1,
        ("first", b"b"),
        ("early", b"y"),
    )
    assert first_divergence({"first": (b"a",), "same": (b"a",)}) is None


def test_a_stream_that_stops_early_or_runs_on_diverges_where_the_other_ends() -> None:
    shorter = first_divergence({"first": (b"a", b"b"), "short": (b"a",)})
    assert shorter is not None
    assert (shorter.step, shorter.actual) == (1, ("short", MISSING))
    longer = first_divergence({"first": (b"a",), "long": (b"a", b"b")})
    assert longer is not None
    assert (longer.step, longer.expected) == (1, ("first", MISSING))
