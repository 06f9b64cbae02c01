"""Step 1, nominate: which batch jobs come next. Allocations in fair-share order
(below their entitlement first, then the rest level by level, usage ÷ weight:
``charges.py``, ``fairshare.py``), and first of all the jobs that nodes were reserved
for, once they fit there (``reservations.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from libs.core.capacity import Fit
from libs.core.facts import Facts
from libs.core.model import WorkClass
from libs.core.queues import Waiting


def ranked(facts: Facts, tier: WorkClass, rank: dict[str, int]) -> list[str]:
    """The tier's allocations with waiting work, best ranked first (an allocation the
    tree does not name last; ties by name)."""
    unknown = len(rank)
    return sorted(facts.queues.allocations(tier), key=lambda a: (rank.get(a, unknown), a))


def reserved_fits(facts: Facts, *, earmarked: bool) -> Iterator[tuple[Waiting, Fit]]:
    """The jobs with nodes reserved for them that fit now, and where: those whose
    nodes are earmarked (``earmarked``), or those whose nodes are being freed. Lazy: each is
    asked once the one before it is placed."""
    capacity, reservations = facts.capacity, facts.reservations
    if not capacity.total_free:
        return
    for job_id in sorted(reservations.nominated):
        if (job_id in reservations.earmarks) != earmarked:
            continue
        job = facts.queues.jobs[job_id]
        if job.spec.gpus > capacity.total_free:
            continue  # surely no fit: skip building the nodes it may not use
        fit = capacity.fit(job.spec, reservations.blocked_for(job_id))
        if isinstance(fit, Fit):
            yield job, fit
