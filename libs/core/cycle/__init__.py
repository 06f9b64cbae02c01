"""The cycle: what the state allows now, run after every input the fold applied
(``fold.py``). One module per step, in the order they run:

  0. ``arbitrate``: serving arbitration. Idle serving GPUs go back to batch work, the
     pool grows onto freed GPUs, a backed-up pool stops batch work it may, and
     workflows no GPU could take are planned again.
  1. ``nominate``: allocations ranked by fair share; the jobs nodes were reserved for
     go first, on those nodes.
  2. ``admit``: the tiers in turn (debug work, the fast path; allocated work; free
     work), each allocation in rank order, placing every job that fits.
  3. ``preempt``: the first job of a tier that does not fit may take idle serving GPUs
     beyond their share, or stop free work and past-contract work ranked below it,
     losing the least; or the nodes that free soonest are earmarked for it. Only so many plans a
     pass (``DEBUG_PLANS``, ``ALLOCATED_PLANS``): planning reads all running work.
  4. ``tell``: jobs that still wait hear why when their reason changes; the
     decisions go out charged and addressed.

Steps 2 to 4 interleave per allocation (``_batch_pass``): a head that does not fit
is planned for, and hears why, before the next allocation's turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.core.cycle import arbitrate, tell
from libs.core.cycle.admit import Shape, may_place, place_allocation, place_reserved
from libs.core.cycle.nominate import ranked
from libs.core.cycle.preempt import preempt_for
from libs.core.decisions import Decision
from libs.core.facts import Facts
from libs.core.ids import JobId
from libs.core.model import WorkClass
from libs.core.queues import TIERS

if TYPE_CHECKING:
    from libs.core.fold import Applied, Trigger

DEBUG_PLANS = 8  # debug jobs a pass may preempt for
ALLOCATED_PLANS = 3  # allocations whose blocked head a pass may preempt or earmark for


def run(facts: Facts, applied: Applied) -> list[Decision]:
    """The pass an input needs, after what it decided at once."""
    decisions, trigger = applied
    if trigger is not None:
        decisions = decisions + _cycle(facts, trigger)
    arbitrate.measure(facts)
    return tell.settled(facts, decisions) if decisions else []


def _cycle(facts: Facts, trigger: Trigger) -> list[Decision]:
    due = facts.reservations.round_due(
        facts.now, fast=trigger.fast, budget_changed=trigger.budget_changed
    )
    if trigger.reported and not (due or trigger.clock_moved):
        # It changed only what preemption reads (a contract's clock, idleness), and
        # no time passed: a pass could decide otherwise only in a preemption round.
        return []
    decisions = arbitrate.arbitrate(facts)
    decisions += _batch_pass(facts, due)
    arbitrate.settle(facts)
    job_id = trigger.job_id
    if job_id is not None and job_id not in facts.reasons:
        # Every new (or released) job hears why it waits, even when the pass stopped early.
        waiting = facts.queues.jobs.get(job_id)
        if waiting is not None:
            decisions += tell.wait(facts, waiting)
    return decisions


def _batch_pass(facts: Facts, preempt: bool) -> list[Decision]:
    """Steps 1 to 4 over the batch queues; ``preempt``: a preemption round is due."""
    queues, reservations = facts.queues, facts.reservations
    if not queues:
        return []
    reservations.expire(facts.now)
    if not (preempt or facts.capacity.total_free):
        return tell.tell_heads(facts)  # the pass below would only do this, ranking first
    rank = facts.charges.rank(facts.now)
    nominated = tell.nominated_heads(facts)
    # Jobs that preempted for room go first, on the nodes freed for them.
    decisions = place_reserved(facts, earmarked=False)
    # Shapes that did not fit: capacity only shrinks during a pass, so jobs of the
    # same shape need not be tried again.
    failed: set[Shape] = set()
    for tier in TIERS:
        if tier is WorkClass.ALLOCATED:  # after the fast path, an earmark's turn
            decisions += place_reserved(facts, earmarked=True)
        # Planning scans the running work, so a pass plans for few jobs: the
        # heads of the best-ranked allocations with blocked work, and a handful of
        # debug jobs (small, short, and meant to start within seconds).
        tries = 0
        if preempt and tier is not WorkClass.UNALLOCATED:
            tries = DEBUG_PLANS if tier is WorkClass.DEBUG else ALLOCATED_PLANS
        planned: set[JobId] = set()
        for allocation in ranked(facts, tier, rank):
            if not (tries or may_place(facts, tier)):
                # Nothing left to place or plan for (the common case once a pass has
                # filled the freed GPUs): only a head that has not heard why it waits.
                decisions += tell.tell_head(facts, tier, allocation, nominated)
                continue
            decisions += place_allocation(facts, tier, allocation, failed, rank)
            head = queues.head(tier, allocation)
            if head is None:
                continue
            blocked = (
                queues.in_order(tier, allocation, tries) if tier is WorkClass.DEBUG else [head]
            )
            for job in blocked:
                freeing = job.job_id in reservations.nominated
                if tries and (not freeing or job.job_id in reservations.earmarks):
                    tries -= 1
                    planned.add(job.job_id)
                    decisions += preempt_for(facts, job, rank)
                    nominated = tell.nominated_heads(facts)
            decisions += tell.tell_head(facts, tier, allocation, nominated)
        if preempt and tier is WorkClass.ALLOCATED:
            reservations.keep_earmarks(planned)
    if facts.capacity.total_free and not queues.allocations(WorkClass.UNALLOCATED):
        # The debug headroom is kept free for free work to fill; with none
        # waiting, idle GPUs would help nobody, so allocated work may take them.
        for allocation in ranked(facts, WorkClass.ALLOCATED, rank):
            decisions += place_allocation(
                facts, WorkClass.ALLOCATED, allocation, failed, rank, headroom=False
            )
    return decisions
