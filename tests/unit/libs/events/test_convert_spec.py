"""A batch job's spec survives the log: every field, durations and simulation entries included."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from qm.v1 import types_pb2

from libs.core import simulated
from libs.events.convert import spec_from_proto, spec_to_proto
from tests.builders import job


def test_a_spec_with_a_runtime_estimate_round_trips() -> None:
    spec = job(2, min_runtime_s=600, runtime_estimate_s=5400.25, env=(("A", "1"),))
    proto = spec_to_proto(spec)
    assert proto.runtime_estimate == Duration(seconds=5400, nanos=250_000_000)
    assert proto.min_runtime == Duration(seconds=600)
    assert spec_from_proto(proto) == spec
    assert spec_to_proto(spec_from_proto(proto)) == proto


def test_simulation_entries_travel_in_the_environment_and_round_trip() -> None:
    spec = job(1, env=(("A", "1"),), simulated_duration_s=0.1, simulated_exit_code=3)
    proto = spec_to_proto(spec)
    assert dict(proto.env) == {"A": "1", simulated.SECONDS: "0.1", simulated.EXIT: "3"}
    assert spec_from_proto(proto) == spec
    assert spec_to_proto(spec_from_proto(proto)).SerializeToString(
        deterministic=True
    ) == proto.SerializeToString(deterministic=True)


def test_an_unreadable_simulation_entry_stays_in_the_environment_for_validation() -> None:
    proto = types_pb2.JobSpec(env={simulated.SECONDS: "soon", simulated.EXIT: "2"})
    spec = spec_from_proto(proto)
    assert (spec.simulated_duration_s, spec.simulated_exit_code) == (0.0, 2)
    assert spec.env == ((simulated.SECONDS, "soon"),)


def test_a_fractional_contract_counts_as_the_next_whole_second() -> None:
    proto = types_pb2.JobSpec(min_runtime=Duration(seconds=1, nanos=1))
    assert spec_from_proto(proto).min_runtime_s == 2


def test_an_array_element_travels_to_its_node_agent_without_changing_the_state_digest() -> None:
    plain = job(1)
    element = job(1, array=(4, 10))
    proto = spec_to_proto(element)
    assert (proto.array.index, proto.array.count) == (4, 10)
    assert spec_from_proto(proto) == element and not spec_to_proto(plain).HasField("array")
    assert element.fact == plain.fact  # how it runs, not how it is scheduled
