"""Step 4, tell: each waiting job hears why it waits when its reason changes, and the
pass's decisions go out as the log records them.

A reason is said once: a job's last reason is declared state (``Facts.reasons``), so a
pass that changes nothing for a job says nothing to it. Only the heads of queues that
moved since they heard (``Queues.moved``), and those with nodes freed or held for
them, are looked at.
"""

from __future__ import annotations

from dataclasses import replace

from libs.core.capacity import Fit, NoFit, describe
from libs.core.decisions import Decision, Place, ServingHeld, ServingReleased, Wait
from libs.core.facts import Facts
from libs.core.model import WorkClass
from libs.core.queues import TIERS, Waiting
from libs.core.wait_reasons import WaitCode, WaitReason


def wait(facts: Facts, job: Waiting, fit: Fit | NoFit | None = None) -> list[Decision]:
    """Tell a waiting job why, when the reason changed."""
    reservations = facts.reservations
    nominated = reservations.nominated.get(job.job_id)
    if nominated is not None:
        marked = job.job_id in reservations.earmarks
        code = WaitCode.NODES_EARMARKED if marked else WaitCode.BEING_FREED
        reason = WaitReason.of(code, needs=describe(job.spec), nodes=", ".join(nominated))
    else:
        fit = fit or facts.capacity.fit(job.spec, reservations.blocked_for(job.job_id))
        if isinstance(fit, Fit):
            return []
        reason = fit.why
        if fit.possible:
            facts.impossible.pop(job.job_id)
        else:
            facts.impossible[job.job_id] = None
    if facts.reasons.get(job.job_id) == reason:
        return []
    facts.reasons[job.job_id] = reason
    return [Wait(job.job_id, reason)]


def recheck_impossible(facts: Facts) -> list[Decision]:
    """A node joined: the jobs no node could ever hold hear their reason afresh."""
    decisions: list[Decision] = []
    for job_id in sorted(facts.impossible):
        job = facts.queues.jobs.get(job_id)
        facts.impossible.pop(job_id)
        if job is not None:
            decisions += wait(facts, job)
    return decisions


def tell_heads(facts: Facts) -> list[Decision]:
    """``tell_head`` for every allocation, tier by tier in rank order; the rank is
    computed only when a head is to hear something (most passes on a full cluster
    have nothing to say)."""
    queues = facts.queues
    nominated = nominated_heads(facts)
    untold: list[tuple[WorkClass, str]] = []
    for tier in TIERS:
        for allocation in queues.moved(tier) | {a for t, a in nominated if t is tier}:
            if _untold(facts, tier, allocation):
                untold.append((tier, allocation))
            else:
                queues.settle(tier, allocation)
    if not untold:
        return []
    rank = facts.charges.rank(facts.now)
    untold.sort(key=lambda t: (TIERS.index(t[0]), rank.get(t[1], len(rank)), t[1]))
    return [d for tier, allocation in untold for d in tell_head(facts, tier, allocation, nominated)]


def tell_head(
    facts: Facts, tier: WorkClass, allocation: str, nominated: set[tuple[WorkClass, str]]
) -> list[Decision]:
    """The allocation's first job hears why it waits, if it has not (or its nodes
    are being freed or held). Only allocations whose first job moved since it heard,
    and those with nominated jobs, are looked at (``Queues.moved``)."""
    if allocation not in facts.queues.moved(tier) and (tier, allocation) not in nominated:
        return []
    head = _untold(facts, tier, allocation)
    decisions = [] if head is None else wait(facts, head)
    if head is None or head.job_id in facts.reasons:
        facts.queues.settle(tier, allocation)  # a head that fits now is asked again
    return decisions


def _untold(facts: Facts, tier: WorkClass, allocation: str) -> Waiting | None:
    """The allocation's first waiting job, if it has not heard why it waits, or its
    nodes are being freed or held (which changes as they are)."""
    head = facts.queues.head(tier, allocation)
    if head is None or (
        head.job_id in facts.reasons and head.job_id not in facts.reservations.nominated
    ):
        return None
    return head


def nominated_heads(facts: Facts) -> set[tuple[WorkClass, str]]:
    """(tier, allocation) of the jobs that nodes are being freed or held for: their
    heads hear again as that changes."""
    jobs = facts.queues.jobs
    return {
        (jobs[job_id].spec.work_class, jobs[job_id].spec.allocation)
        for job_id in facts.reservations.nominated
    }


def settled(facts: Facts, decisions: list[Decision]) -> list[Decision]:
    """The input's decisions as they go out: serving's GPUs charged as they are held
    (``ServingHeld``, ``ServingReleased``: the ledger folds the same), and each
    placement addressed to its node's agent incarnation (see ``Place``)."""
    out: list[Decision] = []
    for decision in decisions:
        if isinstance(decision, ServingHeld | ServingReleased):
            facts.charges.serving(decision, facts.now)
        elif isinstance(decision, Place):
            incarnation = facts.liveness.incarnations.get(decision.node_id, "")
            if incarnation:
                decision = replace(decision, node_incarnation=incarnation)
        out.append(decision)
    return out
