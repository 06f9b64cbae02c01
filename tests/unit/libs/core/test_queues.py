"""Waiting work (``libs/core/queues.py``): tiers, allocations, sizes, and queue order."""

from __future__ import annotations

import operator
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from libs.core.model import JobSpec, WorkClass
from libs.core.queues import TIERS, Queues, Waiting
from tests.builders import job

ALLOCATED = WorkClass.ALLOCATED


def waiting(job_id: str, seq: int, spec: JobSpec | None = None, *, gpus: int = 4) -> Waiting:
    return Waiting(job_id, spec or job(gpus, min_runtime_s=3600), seq, 0, since=0.0)


def queues(*jobs: Waiting) -> Queues:
    q = Queues()
    for j in jobs:
        q.push(j)
    return q


def order(q: Queues, tier: WorkClass = ALLOCATED, allocation: str = "team-a") -> list[str]:
    return [j.job_id for j in q.in_order(tier, allocation, 100)]


def test_the_tiers_go_debug_then_allocated_then_free() -> None:
    assert TIERS == (WorkClass.DEBUG, WorkClass.ALLOCATED, WorkClass.UNALLOCATED)


def test_higher_priority_goes_first_then_submission_order() -> None:
    q = queues(
        waiting("low-early", 1),
        waiting("high-late", 3, job(4, min_runtime_s=3600, priority=5)),
        waiting("low-late", 2),
    )
    assert order(q) == ["high-late", "low-early", "low-late"]


def test_equal_priority_and_submission_order_are_broken_by_job_id() -> None:
    # Submission order is unique in practice; the job id keeps the order total anyway.
    q = queues(waiting("b", 1), waiting("a", 1), waiting("c", 1))
    assert order(q) == ["a", "b", "c"]


def test_a_requeued_job_keeps_its_place_by_submission_order() -> None:
    q = queues(waiting("second", 2), waiting("third", 3))
    q.push(Waiting("first", job(4, min_runtime_s=3600), 1, attempt=1, since=500.0))
    assert order(q) == ["first", "second", "third"]


def test_jobs_of_all_sizes_are_merged_into_one_queue_order() -> None:
    q = queues(waiting("big", 1, gpus=8), waiting("small", 2, gpus=1), waiting("mid", 3, gpus=4))
    assert order(q) == ["big", "small", "mid"]
    assert q.head(ALLOCATED, "team-a") is q.jobs["big"]


def test_candidates_skip_sizes_that_cannot_fit() -> None:
    q = queues(waiting("big", 1, gpus=8), waiting("small", 2, gpus=1), waiting("mid", 3, gpus=4))
    fits = [j.job_id for j in q.candidates(ALLOCATED, "team-a", lambda gpus: gpus <= 4)]
    assert fits == ["small", "mid"]


def test_a_walk_after_a_placement_asks_the_sizes_again_from_the_job_after_it() -> None:
    q = queues(
        waiting("a", 1, gpus=2),
        waiting("b", 2, gpus=4),
        waiting("c", 3, gpus=2),
        waiting("d", 4, gpus=1),
    )
    largest = 4
    seen: list[str] = []
    after = None
    walking = True
    while walking:
        walking = False
        for j in q.candidates(ALLOCATED, "team-a", partial(operator.ge, largest), after):
            seen.append(j.job_id)
            after = j.key
            if j.job_id != "c":  # c is passed over (say, its type does not fit)
                q.remove(j.job_id)  # placed: the walk starts again after it
                largest -= j.spec.gpus
                walking = True
                break
    # a took 2 of 4: b (4 GPUs) no longer fits; c is passed over; d (1) fits.
    assert seen == ["a", "c", "d"]
    assert list(q.jobs) == ["b", "c"]


def test_a_walk_after_a_job_starts_past_it_in_every_size() -> None:
    q = queues(*(waiting(f"j{i}", i, gpus=1 + i % 3) for i in range(9)))
    first = list(q.candidates(ALLOCATED, "team-a", lambda _: True))
    after = first[3].key
    rest = list(q.candidates(ALLOCATED, "team-a", lambda _: True, after))
    assert rest == first[4:]


def test_jobs_are_queued_by_tier_and_allocation() -> None:
    q = queues(
        waiting("debug", 1, job(1, min_runtime_s=60)),
        waiting("free", 2, job(8)),
        waiting("a", 3),
        waiting("b", 4, job(4, allocation="team-b", min_runtime_s=3600)),
    )
    assert q.allocations(WorkClass.DEBUG) == ["team-a"]
    assert q.allocations(WorkClass.UNALLOCATED) == ["team-a"]
    assert q.allocations(ALLOCATED) == ["team-a", "team-b"]
    assert order(q, WorkClass.DEBUG) == ["debug"]
    assert order(q, ALLOCATED, "team-b") == ["b"]


def test_removing_the_last_job_of_an_allocation_forgets_the_allocation() -> None:
    q = queues(waiting("a", 1), waiting("b", 2, gpus=8))
    assert q.remove("a") is not None
    assert q.allocations(ALLOCATED) == ["team-a"]
    assert q.remove("b") is not None
    assert q.allocations(ALLOCATED) == []
    assert q.head(ALLOCATED, "team-a") is None
    assert len(q) == 0


def test_removing_an_unknown_job_changes_nothing() -> None:
    q = queues(waiting("a", 1))
    assert q.remove("ghost") is None
    assert order(q) == ["a"]


def test_in_order_returns_at_most_the_limit() -> None:
    q = queues(*(waiting(f"j{i}", i) for i in range(5)))
    assert [j.job_id for j in q.in_order(ALLOCATED, "team-a", 2)] == ["j0", "j1"]
    assert q.in_order(ALLOCATED, "nobody", 2) == []


def test_jobs_ahead_count_earlier_tiers_better_ranked_allocations_and_earlier_jobs() -> None:
    team_b = job(4, allocation="team-b", min_runtime_s=3600)
    q = queues(
        waiting("debug", 1, job(1, allocation="team-c", min_runtime_s=60)),  # earlier tier
        waiting("b1", 2, team_b),  # team-b ranks before team-a
        waiting("b2", 3, team_b),
        waiting("a1", 4),  # before a2 in team-a's own queue
        waiting("a2", 5),
        waiting("a3", 6),  # after it
        waiting("free", 7, job(8, allocation="team-b")),  # a later tier
    )
    rank = {"team-b": 0, "team-a": 1}
    assert q.ahead_of(q.jobs["a2"], rank) == 1 + 2 + 1
    assert q.ahead_of(q.jobs["debug"], rank) == 0
    assert q.ahead_of(q.jobs["free"], rank) == 6


def test_jobs_ahead_treat_equal_ranks_by_allocation_name_and_unknown_ones_as_last() -> None:
    q = queues(
        waiting("b", 1, job(4, allocation="team-b", min_runtime_s=3600)),
        waiting("a", 2),
        waiting("x", 3, job(4, allocation="unknown", min_runtime_s=3600)),
    )
    rank = {"team-a": 0, "team-b": 0}  # a tie: by name
    assert q.ahead_of(q.jobs["a"], rank) == 0
    assert q.ahead_of(q.jobs["b"], rank) == 1
    assert q.ahead_of(q.jobs["x"], rank) == 2


# -- properties ----------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.integers(0, 15),  # job number
            st.sampled_from([1, 2, 4, 8]),
            st.integers(0, 2),  # priority
            st.sampled_from(["team-a", "team-b"]),
        ),
        st.tuples(st.just("remove"), st.integers(0, 15), st.just(0), st.just(0), st.just("")),
    ),
    max_size=40,
)


@given(operations)
def test_queue_order_is_priority_then_submission_whatever_the_pushes_and_removes(
    ops: list[tuple[str, int, int, int, str]],
) -> None:
    q = Queues()
    seq = 0
    for kind, number, gpus, priority, allocation in ops:
        job_id = f"j{number}"
        if kind == "push" and job_id not in q.jobs:
            seq += 1
            spec = job(gpus, allocation=allocation, min_runtime_s=3600, priority=priority)
            q.push(Waiting(job_id, spec, seq, 0, 0.0))
        elif kind == "remove":
            q.remove(job_id)
    for allocation in ("team-a", "team-b"):
        expected = sorted(
            (j for j in q.jobs.values() if j.spec.allocation == allocation),
            key=lambda j: (-j.spec.priority, j.seq),
        )
        assert q.in_order(ALLOCATED, allocation, 100) == expected
        assert list(q.candidates(ALLOCATED, allocation, lambda _: True)) == expected
        assert q.head(ALLOCATED, allocation) == (expected[0] if expected else None)
    assert sorted(q.allocations(ALLOCATED)) == sorted({j.spec.allocation for j in q.jobs.values()})
    rank = {"team-a": 0, "team-b": 1}
    everyone = sorted(
        q.jobs.values(), key=lambda j: (rank[j.spec.allocation], -j.spec.priority, j.seq)
    )
    assert [q.ahead_of(j, rank) for j in everyone] == list(range(len(everyone)))
