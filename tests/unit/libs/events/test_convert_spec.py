"""A batch job's spec survives the log: every field, the runtime estimate included."""

from __future__ import annotations

from libs.events.convert import spec_from_proto, spec_to_proto
from tests.builders import job


def test_a_spec_with_a_runtime_estimate_round_trips() -> None:
    spec = job(2, min_runtime_s=600, runtime_estimate_s=5400.0, env=(("A", "1"),))
    proto = spec_to_proto(spec)
    assert proto.runtime_estimate_s == 5400.0
    assert spec_from_proto(proto) == spec
    assert spec_to_proto(spec_from_proto(proto)) == proto
