"""The fuzzer's requests: every one can be sent, and each odd field is really odd."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.fuzz import HEAVY, MB, MUTATIONS, REQUEST_TYPES, random_message
from tests.chaos.workload import make_spec, workflows


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_requests_of_every_type_serialise_within_their_budget(seed: int) -> None:
    rng = random.Random(seed)
    for _, cls in REQUEST_TYPES:
        request = cls()
        random_message(request, rng, [2 * MB])
        # Sent as is: a request the client cannot even encode would test nothing.
        assert len(request.SerializeToString()) < 3 * MB


def test_every_mutation_changes_a_valid_job_and_only_the_heavy_ones_are_large() -> None:
    flows = workflows()
    for label, change, _ in MUTATIONS:
        rng = random.Random(label)
        spec = make_spec(rng, "small", flows)
        before = spec.SerializeToString()
        change(spec, rng)
        assert spec.SerializeToString() != before, label
        # Light ones are sent thousands of times: they must stay small.
        assert spec.ByteSize() < MB or label in HEAVY, label
