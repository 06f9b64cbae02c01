"""A batch decision's record says how a job is protected, who it was preempted for, and
why a job waits, in words and as a code with fields."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import events_pb2, types_pb2

from libs.core import Place, Preemption, PreemptionRule, Protection, Stop, StopCause, Wait
from libs.core.limits import MAX_REASON_CHARS
from libs.core.wait_reasons import WaitCode, WaitReason
from libs.events.convert import decision_payload, preemption_from_proto, stop_cause_from_proto
from tests.builders import job

PROVENANCE = types_pb2.Provenance(policy="budget", policy_version=1)


@pytest.mark.parametrize(
    ("protection", "protected_s", "wire"),
    [
        (None, 0.0, types_pb2.PROTECTION_UNSPECIFIED),
        (Protection.FREE, 0.0, types_pb2.PROTECTION_FREE),
        (Protection.CONTRACT, 600.0, types_pb2.PROTECTION_CONTRACT),
        (Protection.BORROWED, 0.0, types_pb2.PROTECTION_BORROWED),
    ],
)
def test_a_placement_records_its_protection(
    protection: Protection | None, protected_s: float, wire: types_pb2.Protection.ValueType
) -> None:
    place = Place("j", "j/0", "n1", (0,), job(1), None, "", protection, protected_s)
    record = decision_payload(place, PROVENANCE)
    assert isinstance(record, events_pb2.TaskPlaced)
    assert record.protection == wire
    assert record.HasField("protected_for") == bool(protected_s)
    if protected_s:
        assert record.protected_for == Duration(seconds=600)


@pytest.mark.parametrize("rule", list(PreemptionRule))
def test_a_preemption_round_trips_for_whom_and_by_which_rule(rule: PreemptionRule) -> None:
    preemption = Preemption("j-2", "nlp", rule)
    stop = Stop("j", "j/0", "n1", StopCause.PREEMPTED, str(preemption), 5.0, preemption)
    record = decision_payload(stop, PROVENANCE)
    assert isinstance(record, events_pb2.TaskStopRequested)
    assert preemption_from_proto(record.preemption) == preemption
    assert str(preemption) == f"preempted for j-2 of nlp: {rule.value}"


def test_a_stop_that_is_no_preemption_records_none() -> None:
    stop = Stop("j", "j/0", "n1", StopCause.CANCELLED, "cancelled by user")
    record = decision_payload(stop, PROVENANCE)
    assert isinstance(record, events_pb2.TaskStopRequested)
    assert not record.HasField("preemption")
    assert preemption_from_proto(record.preemption) is None  # no rule said


@pytest.mark.parametrize("cause", list(StopCause))
def test_a_stop_cause_round_trips(cause: StopCause) -> None:
    record = decision_payload(Stop("j", "j/0", "n1", cause, "why"), PROVENANCE)
    assert isinstance(record, events_pb2.TaskStopRequested)
    assert stop_cause_from_proto(record.cause) is cause


def test_an_unsaid_stop_cause_is_none() -> None:
    assert stop_cause_from_proto(types_pb2.STOP_CAUSE_UNSPECIFIED) is None


def test_a_preemption_for_workflow_serving_names_the_allocation() -> None:
    serving = Preemption("", "vision", PreemptionRule.FREE_WORK)
    assert str(serving).startswith("preempted for workflow serving of vision")


def test_a_wait_records_its_code_its_fields_and_their_words() -> None:
    why = WaitReason.of(WaitCode.NODES_EARMARKED, needs="16×H100", nodes="n1, n2")
    record = decision_payload(Wait("j", why), PROVENANCE)
    assert isinstance(record, events_pb2.JobPending)
    assert record.reason == "needs 16×H100; n1, n2 are earmarked for it as they free up"
    assert record.code == "nodes_earmarked"
    assert [(f.name, f.value) for f in record.fields] == [("needs", "16×H100"), ("nodes", "n1, n2")]


def test_a_waits_figures_are_cut_as_its_words_are() -> None:
    nodes = ", ".join(f"node-{i:04}" for i in range(1000))  # far past the limit
    why = WaitReason.of(WaitCode.BEING_FREED, needs="1000×GPU", nodes=nodes)
    record = decision_payload(Wait("j", why), PROVENANCE)
    assert isinstance(record, events_pb2.JobPending)
    assert len(record.reason) == MAX_REASON_CHARS and record.reason.endswith("…")
    assert len(record.fields[1].value) == MAX_REASON_CHARS
