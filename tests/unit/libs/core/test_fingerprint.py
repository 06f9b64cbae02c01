"""The state digest (``libs/core/fingerprint.py``): equal facts, equal digest, whatever the path."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from libs.core.fingerprint import Fingerprint, fact_hash

EMPTY = bytes(32)


def digest_of(*facts: str) -> bytes:
    fp = Fingerprint()
    for fact in facts:
        fp.add(fact)
    return fp.digest()


def test_an_empty_state_has_the_zero_digest_of_32_bytes() -> None:
    assert Fingerprint().digest() == EMPTY


def test_removing_what_was_added_gives_the_digest_back() -> None:
    fp = Fingerprint()
    fp.add("w|j1|0")
    fp.add("n|n0|H100")
    fp.remove("w|j1|0")
    assert fp.digest() == digest_of("n|n0|H100")
    fp.remove("n|n0|H100")
    assert fp.digest() == EMPTY


def test_different_facts_give_different_digests() -> None:
    assert digest_of("w|j1|0") != digest_of("w|j1|1")
    assert digest_of("a", "b") != digest_of("ab")


def test_a_keyed_fact_replaces_the_one_before_under_its_key() -> None:
    fp = Fingerprint()
    fp.shift(fact_hash("1 of 3 done"))
    fp.shift(fact_hash("2 of 3 done") - fact_hash("1 of 3 done"))
    assert fp.digest() == digest_of("2 of 3 done")
    fp.shift(-fact_hash("2 of 3 done"))
    assert fp.digest() == EMPTY


@given(st.lists(st.text(max_size=8), max_size=12), st.randoms(use_true_random=False))
def test_the_digest_does_not_depend_on_the_order_facts_came_in(
    facts: list[str], rng: random.Random
) -> None:
    shuffled = list(facts)
    rng.shuffle(shuffled)
    assert digest_of(*facts) == digest_of(*shuffled)


@given(st.lists(st.text(max_size=8), max_size=12), st.lists(st.text(max_size=8), max_size=12))
def test_adding_and_removing_other_facts_leaves_the_digest_of_the_rest(
    kept: list[str], transient: list[str]
) -> None:
    fp = Fingerprint()
    for fact in transient:
        fp.add(fact)
    for fact in kept:
        fp.add(fact)
    for fact in reversed(transient):
        fp.remove(fact)
    assert fp.digest() == digest_of(*kept)
