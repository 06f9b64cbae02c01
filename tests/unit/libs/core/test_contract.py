"""The contract (``libs/core/contract.py``): what a minimum runtime protects, who may preempt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from libs.core.contract import RunningJob, borrows, may_preempt, victim_order
from libs.core.model import JobSpec, WorkClass
from tests.builders import job

HOUR = 3600.0
RANK = {"first": 0, "second": 1, "third": 2}  # fair-share rank: 0 goes first

FREE = job(4, allocation="third")  # minimum runtime 0
ALLOCATED = job(4, allocation="first", min_runtime_s=3600)
DEBUG = job(1, allocation="third", min_runtime_s=600)


def running(
    spec: JobSpec,
    *,
    started_at: float | None = 0.0,
    protect_s: float | None = None,
    idle: bool = False,
    gpus: int | None = None,
    seq: int = 1,
    job_id: str = "victim",
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        spec=spec,
        node_id="n0",
        gpus=spec.gpus if gpus is None else gpus,
        started_at=started_at,
        idle=idle,
        seq=seq,
        protect_s=spec.min_runtime_s if protect_s is None else protect_s,
    )


def test_work_classes_follow_gpus_and_minimum_runtime() -> None:
    assert job(8).work_class is WorkClass.UNALLOCATED  # minimum runtime 0: free
    assert job(2, min_runtime_s=15 * 60).work_class is WorkClass.DEBUG  # the fast path
    assert job(3, min_runtime_s=60).work_class is WorkClass.ALLOCATED  # too many GPUs
    assert job(1, min_runtime_s=15 * 60 + 1).work_class is WorkClass.ALLOCATED  # too long


def test_allocated_work_is_protected_until_its_minimum_runtime_is_met() -> None:
    victim = running(job(4, min_runtime_s=3600), started_at=100.0)
    assert victim.protected(100.0)
    assert victim.protected(100.0 + 3599.9)
    assert not victim.protected(100.0 + 3600.0)  # met exactly: no longer protected
    assert not victim.protected(100.0 + 10 * HOUR)


def test_the_contract_clock_starts_only_when_the_task_really_starts() -> None:
    placed_not_started = running(job(4, min_runtime_s=60), started_at=None)
    assert placed_not_started.protected(10**9)


def test_the_protection_is_the_capped_minimum_runtime_not_the_requested_one() -> None:
    # The scheduler passes min(minimum runtime, max_min_runtime_s) as protect_s.
    victim = running(job(4, min_runtime_s=10 * 3600), started_at=0.0, protect_s=8 * HOUR)
    assert victim.protected(8 * HOUR - 1)
    assert not victim.protected(8 * HOUR)


def test_free_work_is_never_protected() -> None:
    assert not running(FREE, started_at=None).protected(0.0)
    assert not running(FREE, started_at=0.0).protected(0.0)


def test_free_work_never_preempts() -> None:
    assert not may_preempt(FREE, running(FREE), RANK, now=HOUR)
    assert not may_preempt(job(1), running(ALLOCATED), RANK, now=10 * HOUR)


def test_allocated_work_preempts_free_work_at_any_time() -> None:
    just_started = running(FREE, started_at=HOUR)
    assert may_preempt(ALLOCATED, just_started, RANK, now=HOUR)
    # Even free work of an allocation ranked above its own.
    free_of_the_first = running(job(4, allocation="first"))
    assert may_preempt(job(4, allocation="third", min_runtime_s=60), free_of_the_first, RANK, HOUR)


def test_allocated_work_preempts_past_contract_work_only_of_lower_ranked_allocations() -> None:
    waiting = job(4, allocation="second", min_runtime_s=3600)
    lower = running(job(4, allocation="third", min_runtime_s=60))
    higher = running(job(4, allocation="first", min_runtime_s=60))
    same = running(job(4, allocation="second", min_runtime_s=60))
    assert may_preempt(waiting, lower, RANK, now=HOUR)
    assert not may_preempt(waiting, higher, RANK, now=HOUR)
    assert not may_preempt(waiting, same, RANK, now=HOUR)


def test_an_allocation_outside_the_tree_ranks_below_every_known_one() -> None:
    stranger = running(job(4, allocation="gone", min_runtime_s=60))
    assert may_preempt(job(4, allocation="third", min_runtime_s=60), stranger, RANK, now=HOUR)
    assert not may_preempt(
        job(4, allocation="gone", min_runtime_s=60),
        running(job(4, allocation="elsewhere", min_runtime_s=60)),
        RANK,
        now=HOUR,
    )


def test_protected_work_is_never_preempted_even_by_the_first_ranked() -> None:
    victim = running(job(4, allocation="third", min_runtime_s=3600), started_at=0.0)
    assert not may_preempt(ALLOCATED, victim, RANK, now=3599.0)
    assert not may_preempt(DEBUG, victim, RANK, now=3599.0)
    assert may_preempt(ALLOCATED, victim, RANK, now=3600.0)


def test_debug_work_preempts_past_contract_work_of_any_rank_but_not_other_debug_work() -> None:
    waiting = job(1, allocation="third", min_runtime_s=600)  # ranked last
    assert waiting.work_class is WorkClass.DEBUG
    past_contract = running(job(4, allocation="first", min_runtime_s=60))
    assert may_preempt(waiting, past_contract, RANK, now=HOUR)
    other_debug = running(job(1, allocation="first", min_runtime_s=60))
    assert not may_preempt(waiting, other_debug, RANK, now=HOUR)


def test_victims_go_free_work_first_then_the_most_over_served_allocation() -> None:
    victims = [  # all resumable: none loses work
        running(job(4, allocation="second", min_runtime_s=60, resumable=True), job_id="second"),
        running(job(4, allocation="first", min_runtime_s=60, resumable=True), job_id="first"),
        running(job(8, allocation="first", resumable=True), job_id="free"),
        running(job(4, allocation="third", min_runtime_s=60, resumable=True), job_id="third"),
    ]
    order = sorted(victims, key=lambda v: victim_order(v, RANK, HOUR))
    assert [v.job_id for v in order] == ["free", "third", "second", "first"]


def test_victims_that_lose_the_least_work_go_first() -> None:
    # Resumable work saves at the stop signal: it loses nothing. Work that cannot
    # resume loses all it did: the youngest, and the smallest, loses least.
    victims = [
        running(job(1, allocation="third"), started_at=0.0, job_id="free-old"),
        running(job(4, allocation="first", min_runtime_s=60), started_at=0.0, job_id="old"),
        running(job(4, allocation="first", min_runtime_s=60), started_at=HOUR, job_id="young"),
        running(job(8, allocation="first", min_runtime_s=60, resumable=True), job_id="resumes"),
    ]
    order = sorted(victims, key=lambda v: victim_order(v, RANK, 2 * HOUR))
    assert [v.job_id for v in order] == ["resumes", "free-old", "young", "old"]
    assert [v.lost_gpu_s(2 * HOUR) for v in order] == [0.0, 2 * HOUR, 4 * HOUR, 8 * HOUR]


def test_among_equals_idle_gpus_go_first_then_the_fewest_gpus_then_the_newest() -> None:
    spec = job(4, allocation="second", min_runtime_s=60)
    victims = [
        running(spec, gpus=4, seq=1, job_id="busy-4-old"),
        running(spec, gpus=2, seq=2, job_id="busy-2-old"),
        running(spec, gpus=2, seq=3, job_id="busy-2-new"),
        running(spec, gpus=8, seq=4, idle=True, job_id="idle-8"),
    ]
    order = sorted(victims, key=lambda v: victim_order(v, RANK, HOUR))
    assert [v.job_id for v in order] == ["idle-8", "busy-2-new", "busy-2-old", "busy-4-old"]


# -- properties ----------------------------------------------------------------

specs = st.builds(
    job,
    st.integers(1, 8),
    allocation=st.sampled_from(["first", "second", "third", "gone"]),
    min_runtime_s=st.sampled_from([0, 60, 600, 3600, 8 * 3600]),
)


@given(
    waiting=specs,
    victim=specs,
    started_at=st.floats(0, 1e6),
    elapsed=st.floats(0, 1e5),
)
def test_the_contract_never_lets_work_be_preempted_before_its_minimum_runtime(
    waiting: JobSpec, victim: JobSpec, started_at: float, elapsed: float
) -> None:
    now = started_at + elapsed
    target = running(victim, started_at=started_at)
    if may_preempt(waiting, target, RANK, now):
        assert waiting.allocated
        assert not victim.allocated or now >= started_at + victim.min_runtime_s


@given(waiting=specs, victim=specs)
def test_work_placed_but_not_started_is_preempted_only_if_free(
    waiting: JobSpec, victim: JobSpec
) -> None:
    allowed = may_preempt(waiting, running(victim, started_at=None), RANK, now=1e9)
    assert allowed == (waiting.allocated and not victim.allocated)


def test_charged_work_beyond_its_allocations_share_borrows() -> None:
    paid = job(2, min_runtime_s=3600)
    assert not borrows(paid, holding=4.0, entitled=4.0)  # exactly its share
    assert borrows(paid, holding=4.5, entitled=4.0)
    assert borrows(paid, holding=1.0, entitled=0.0)  # an allocation outside the tree
    assert not borrows(DEBUG, holding=100.0, entitled=1.0)  # the fast path never does
    assert not borrows(FREE, holding=100.0, entitled=1.0)  # free work is never protected
