"""The audit replayer: golden logs reproduce, tampered ones are caught where they were tampered."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.audit import Difference, Replay, audit_logs
from libs.core import POLICY, POLICY_VERSION, PolicyConfig
from libs.events import event_type, new_envelope
from libs.events.logfile import read_log
from tests.golden.record import HERE, Scenario, Step

GOLDEN = HERE
REGENERATE = "run `python -m tests.golden.record` and commit the new files"


@pytest.mark.parametrize("sidecar", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden_logs(sidecar: Path) -> None:
    golden = json.loads(sidecar.read_text())
    assert (golden["policy"], golden["policy_version"]) == (POLICY, POLICY_VERSION), (
        f"{sidecar.name} was recorded by policy {golden['policy']} v{golden['policy_version']}, "
        f"this build runs {POLICY} v{POLICY_VERSION}: regenerate the golden logs, {REGENERATE}"
    )
    inputs = ((0, offset, env) for offset, env in enumerate(read_log(GOLDEN / golden["input"])))
    result = audit_logs(inputs, read_log(GOLDEN / golden["decisions"]))
    found = result.divergence
    wanted = golden["divergence"]
    if wanted is None:
        assert found is None, (
            f"{sidecar.stem} no longer reproduces at input offset {found.input_offset}, "
            f"decision #{found.index}: {found.difference.value} {list(found.fields)}. "
            f"If the policy changed on purpose, bump POLICY_VERSION in libs/core/scheduler.py, "
            f"say what changed in docs/policy-versions.md and {REGENERATE}; otherwise the "
            f"scheduler lost its determinism."
        )
        assert result.checked == result.reproduced == golden["decision_count"] > 0
    else:
        assert found is not None, f"{sidecar.stem} is tampered, but the audit passed it"
        assert {
            "partition": found.partition,
            "input_offset": found.input_offset,
            "index": found.index,
            "difference": found.difference.name,
            "fields": list(found.fields),
        } == wanted
        assert result.reproduced == result.checked - 1


@cache
def _steps(partition: int, jobs: int = 40) -> tuple[Step, ...]:
    return tuple(
        Scenario(
            partition + 3, jobs, partition=partition, cluster=f"c{partition}", arrival_s=20
        ).steps()
    )


def _inputs(steps: tuple[Step, ...], partition: int) -> list[tuple[int, int, events_pb2.Envelope]]:
    return [(partition, step.offset, step.input) for step in steps]


def _recorded(steps: tuple[Step, ...]) -> list[events_pb2.Envelope]:
    return [d for step in steps for d in step.decisions]


def _copy(env: events_pb2.Envelope) -> events_pb2.Envelope:
    copy = events_pb2.Envelope()
    copy.CopyFrom(env)
    return copy


def _provenance(env: events_pb2.Envelope) -> types_pb2.Provenance:
    provenance: types_pb2.Provenance = getattr(env, event_type(env)).provenance
    return provenance


def test_a_replay_in_step_holds_nothing_back() -> None:
    audit = Replay()
    for step in _steps(0):
        audit.feed_input(0, step.offset, step.input)
        for decision in step.decisions:
            audit.feed_recorded(decision)
        assert audit.expected_waiting(0) == audit.recorded_waiting == 0
    result = audit.finish()
    assert result.ok and result.checked == result.reproduced == len(_recorded(_steps(0)))
    assert result.inputs == len(_steps(0))


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_any_interleaving_of_partitions_and_sides_reproduces(seed: int) -> None:
    """Kafka hands out partitions and topics in any mix; only each one's own order holds."""
    # A seed, not ``st.randoms``: each of the thousands of choices would be drawn from
    # hypothesis's buffer, which outgrows its health check as the logs grow.
    rng = random.Random(seed)
    queues: list[list[tuple[int, int, events_pb2.Envelope]] | list[events_pb2.Envelope]] = [
        list(reversed(_inputs(_steps(0), 0))),
        list(reversed(_inputs(_steps(1), 1))),
        list(reversed(_recorded(_steps(0)))),
        list(reversed(_recorded(_steps(1)))),
    ]
    audit = Replay()
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        item = queue.pop()
        if isinstance(item, tuple):
            audit.feed_input(*item)
        else:
            audit.feed_recorded(item)
    result = audit.finish()
    assert result.divergence is None
    assert result.reproduced == len(_recorded(_steps(0))) + len(_recorded(_steps(1)))


def test_all_decisions_before_any_input() -> None:
    audit = Replay()
    for decision in _recorded(_steps(0)):
        audit.feed_recorded(decision)
    for item in _inputs(_steps(0), 0):
        audit.feed_input(*item)
    assert audit.finish().ok


def test_a_changed_digest_is_named() -> None:
    recorded = _recorded(_steps(0))
    tampered = _copy(recorded[5])
    _provenance(tampered).state_digest = b"\0" * 32
    recorded[5] = tampered
    found = audit_logs(_inputs(_steps(0), 0), recorded).divergence
    assert found is not None and found.difference is Difference.DIGEST
    assert found.recorded is tampered and found.expected is not None
    assert found.input_offset == _provenance(tampered).input_offset


def test_a_doubled_decision_is_extra() -> None:
    recorded = _recorded(_steps(0))
    doubled = recorded[10]
    recorded.insert(11, doubled)
    result = audit_logs(_inputs(_steps(0), 0), recorded)
    found = result.divergence
    assert found is not None and found.difference is Difference.EXTRA
    assert found.recorded is doubled and found.expected is None
    assert result.reproduced == 11


def test_a_decision_for_an_input_never_seen_is_extra() -> None:
    steps = _steps(0)
    last = _copy(_recorded(steps)[-1])
    _provenance(last).input_offset = len(steps) + 5
    result = audit_logs(_inputs(steps, 0), [*_recorded(steps), last])
    assert result.divergence is not None and result.divergence.difference is Difference.EXTRA
    assert result.divergence.input_offset == len(steps) + 5


def test_decisions_missing_at_the_end() -> None:
    recorded = _recorded(_steps(0))
    result = audit_logs(_inputs(_steps(0), 0), recorded[:-2])
    found = result.divergence
    assert found is not None and found.difference is Difference.MISSING
    assert found.expected is not None and found.expected.event_id == recorded[-2].event_id


def test_a_decision_of_another_kind_differs_in_its_payload() -> None:
    recorded = _recorded(_steps(0))
    first = recorded[0]
    other = new_envelope(
        events_pb2.JobPending(job_id="j", provenance=_provenance(first)),
        producer=first.producer,
        cluster=first.cluster,
        occurred=first.occurred_at.ToDatetime(),
        event_id=first.event_id,
    )
    found = audit_logs(_inputs(_steps(0), 0), [other, *recorded[1:]]).divergence
    assert found is not None
    assert (found.difference, found.fields) == (Difference.PAYLOAD, ("payload",))


def test_bounds_limit_the_audit_to_what_placement_committed() -> None:
    steps = _steps(0)
    bound = len(steps) // 2
    audit = Replay(bounds={0: bound})
    for decision in _recorded(steps):  # decisions past the bound too
        audit.feed_recorded(decision)
    for item in _inputs(steps, 0):
        audit.feed_input(*item)
    result = audit.finish()
    assert result.ok and result.inputs == bound
    assert result.checked == sum(len(s.decisions) for s in steps[:bound])


def test_records_that_are_not_decisions_are_not_placements() -> None:
    stray = _steps(0)[0].input  # an input event, written to the decisions topic by mistake
    assert audit_logs(_inputs(_steps(0), 0), [stray, *_recorded(_steps(0))]).ok


def _golden_basic() -> tuple[list[tuple[int, int, events_pb2.Envelope]], list[events_pb2.Envelope]]:
    inputs = [
        (0, offset, env)
        for offset, env in enumerate(read_log(GOLDEN / "scheduler-basic.input.bin"))
    ]
    return inputs, list(read_log(GOLDEN / "scheduler-basic.decisions.bin"))


def test_a_replay_under_other_knobs_names_them_with_both_values() -> None:
    inputs, recorded = _golden_basic()
    assert event_type(recorded[0]) == "policy_configured"  # placement's, before its decisions
    other = PolicyConfig(lookback_window_s=86_400, node_lost_timeout_s=60)
    result = audit_logs(inputs, recorded, other)
    assert not result.ok
    assert [d.describe("log", "replay") for d in result.config] == [
        "lookback_window_s: log 604800.0, replay 86400.0",
        "node_lost_timeout_s: log 30.0, replay 60.0",
    ]
    # Every decision under other knobs differs at least in its provenance.
    assert result.divergence is not None and result.reproduced == 0
    assert result.divergence.fields[-1].endswith("provenance.config_digest")


def test_equal_knobs_under_another_digest_are_told_by_the_digest() -> None:
    inputs, recorded = _golden_basic()
    configured = _copy(recorded[0])
    configured.policy_configured.config_digest = b"\0" * 16
    result = audit_logs(inputs, [configured, *recorded[1:]])
    assert [d.name for d in result.config] == ["config_digest"]
    assert result.divergence is None and not result.ok


def test_knobs_announced_for_inputs_past_the_bounds_are_not_audited() -> None:
    _, recorded = _golden_basic()
    audit = Replay(PolicyConfig(lookback_window_s=86_400), bounds={0: 0})
    for decision in recorded:
        audit.feed_recorded(decision)
    assert audit.finish().ok
