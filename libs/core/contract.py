"""The contract: what a job's minimum runtime protects, and who may be preempted.

Work with minimum runtime > 0 is protected until it has run that long (from
its real start, as its node agent reported it). Work with minimum runtime 0
is never protected.

An allocation's entitlement is its guarantee; beyond it, charged work runs on
*borrowed* GPUs (``borrows``, decided when it is placed), and its minimum runtime
does not protect it there (unless ``PolicyConfig.protect_borrowed``): a team below
its share takes them back at once, as borrowed quota is reclaimed, instead of
waiting up to the contract cap behind work that others' idle share let start.
A job that would borrow itself takes them back only from teams further beyond their
share than it would be (``Reclaims``), or once they have run ``RECLAIM_TURN_S``: two
teams' jobs wider than either share would otherwise take the same GPUs from each
other, each borrowing in turn, every preemption round, for ever.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from libs.core.ids import JobId, NodeId
from libs.core.model import JobSpec, WorkClass

# Borrowed work is safe from a job that would borrow itself (but for one of a team
# further beyond its share) this long at most: two jobs wider than their teams'
# shares take turns of this length, not of a preemption round each.
RECLAIM_TURN_S = 1800.0

# The allocations whose borrowed GPUs a waiting job may take back within their turn
# (those further beyond their share than it would be); None: any.
Reclaims = frozenset[str] | None


@dataclass(frozen=True)
class RunningJob:
    """What preemption needs to know about one running job on one node: a gang is
    seen once per node it spans (``gpus`` are those on ``node_id``; stopping any
    part stops it all)."""

    job_id: JobId
    spec: JobSpec
    node_id: NodeId
    gpus: int
    started_at: float | None  # None until its task reported started
    idle: bool
    seq: int  # submission order
    protect_s: float  # its minimum runtime, within the policy's cap
    estimate_s: float | None = None  # how long it is expected to run (planning only)
    checkpointed_at: float | None = None  # when it last said it saved; None: never
    # On borrowed GPUs, the end of its turn (the runtime its contract would protect
    # elsewhere, at most ``RECLAIM_TURN_S``): till then a job that would borrow itself
    # takes them back only from a team further beyond its share (``Reclaims``).
    borrowed_until: float = -math.inf

    def protected(self, now: float) -> bool:
        return now < self.protected_until

    @cached_property
    def protected_until(self) -> float:
        """When its contract stops protecting it (cached: planning asks it of every
        running job)."""
        if not self.spec.allocated:
            return -math.inf
        if self.started_at is None:
            return math.inf  # the contract's clock has not started yet
        return self.started_at + self.protect_s

    @cached_property
    def likely_end(self) -> float:
        """When it likely ends by its estimate; infinite when unknown."""
        if self.estimate_s is None or self.started_at is None:
            return math.inf
        return self.started_at + self.estimate_s

    def lost_gpu_s(self, now: float) -> float:
        """The work stopping it would throw away: all it did for work that cannot resume;
        for resumable work what it did since its last checkpoint once it says when it
        saves (``checkpointed_at``), unless it is warned ahead of a stop, and none
        otherwise (it saves at the stop signal, within the stop grace)."""
        if self.started_at is None:
            return 0.0
        if self.spec.resumable:
            saved = self.lossless_until
            return 0.0 if now <= saved else self.spec.gpus * (now - saved)
        return self.spec.gpus * max(now - self.started_at, 0.0)

    @cached_property
    def lossless_until(self) -> float:
        """Until when stopping it throws nothing away (``lost_gpu_s`` is 0)."""
        if self.started_at is None:
            return math.inf
        if not self.spec.resumable:
            return self.started_at
        if self.checkpointed_at is None or self.spec.warning_signal:
            return math.inf  # it saves at the stop, or its warning
        return self.checkpointed_at


def borrows(spec: JobSpec, holding: float, entitled: float) -> bool:
    """Whether charged work placed now runs on borrowed GPUs: with it, its allocation
    would hold ``holding`` GPUs, more than the ``entitled`` share of the cluster (both
    priced). Debug work never borrows: its contract is short, it is the fast path."""
    return spec.work_class is WorkClass.ALLOCATED and holding > entitled * (1 + 1e-9)


def may_preempt(waiting: JobSpec, victim: RunningJob, rank: dict[str, int], now: float) -> bool:
    """Whether ``waiting`` may take ``victim``'s GPUs.

    Free work never preempts. Allocated work preempts free work at any time,
    and past-contract work of allocations that rank below its own. Debug work
    (the fast path) preempts any past-contract work but other debug work:
    it is small and short, and the reason people stop squatting on GPUs.
    """
    return victims_of(waiting, rank, now)(victim)


def victims_of(
    waiting: JobSpec, rank: dict[str, int], now: float, *, reclaims: Reclaims = None
) -> Callable[[RunningJob], bool]:
    """``may_preempt`` for one waiting job, its side decided once: planning asks it of
    every running job (``reclaims``: whose borrowed GPUs it may take back)."""
    if not waiting.allocated:
        return lambda victim: False
    debug = waiting.work_class is WorkClass.DEBUG
    return victims_for(waiting.allocation, rank, now, debug=debug, reclaims=reclaims)


def victims_for(
    allocation: str,
    rank: dict[str, int],
    now: float,
    *,
    debug: bool = False,
    reclaims: Reclaims = None,
) -> Callable[[RunningJob], bool]:
    """``may_preempt`` for charged work of ``allocation`` (``debug``: debug work): free
    work, and charged work past its contract of allocations ranked below it (any
    non-debug work, for debug work); work on borrowed GPUs within its turn only of the
    allocations it ``reclaims`` from."""
    unknown = len(rank)
    own = rank.get(allocation, unknown)

    def may_take(victim: RunningJob) -> bool:
        if now < victim.protected_until:
            return False
        spec = victim.spec
        if not spec.allocated:
            return True
        borrowed = now < victim.borrowed_until
        if borrowed and reclaims is not None and spec.allocation not in reclaims:
            return False
        if debug:
            return spec.work_class is not WorkClass.DEBUG
        return rank.get(spec.allocation, unknown) > own

    return may_take


def victim_order(
    victim: RunningJob, rank: dict[str, int], now: float
) -> tuple[float, int, int, int, int, int]:
    """Sort key, first victim first: the least work lost, then free work, the most
    over-served allocation, jobs whose GPUs sit idle, the fewest GPUs, the newest."""
    over_served = -rank.get(victim.spec.allocation, len(rank))
    return (
        victim.lost_gpu_s(now),
        1 if victim.spec.allocated else 0,
        over_served if victim.spec.allocated else 0,
        0 if victim.idle else 1,
        victim.spec.gpus,
        -victim.seq,
    )
