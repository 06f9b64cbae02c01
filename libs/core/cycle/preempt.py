"""Step 3, preempt: the first job of a tier that does not fit may take room from
others, losing the least work.

First idle serving GPUs held beyond their share (``arbitrate.yield_serving``); else
free work, and past-contract work of allocations ranked below its own
(``contract.py``), planned over a read-only view of the running work and capacity
(``preemption.py``, ``rooms.py``): nothing is taken while plans are tried, and only
the chosen plan's victims are stopped. The nodes they free are reserved for the job
(a gang's all in one step). When no room comes without throwing work away, the nodes
that free soonest are earmarked for the job (``earmarks.py``, ``reservations.py``).
"""

from __future__ import annotations

from libs.core.cycle.arbitrate import yield_serving
from libs.core.decisions import Decision
from libs.core.endings import preempt
from libs.core.facts import Facts
from libs.core.queues import Waiting


def preempt_for(facts: Facts, job: Waiting, rank: dict[str, int]) -> list[Decision]:
    """Make room for a blocked job, or earmark nodes for it."""
    yielded = yield_serving(facts, job, rank)
    if yielded:
        return yielded
    victims = facts.reservations.plan_for(
        job,
        facts.capacity,
        facts.running,
        rank,
        facts.now,
        reclaims=facts.charges.reclaims(job.spec),
    )
    allocation = job.spec.allocation
    return [d for victim in victims for d in preempt(facts, victim.job_id, job.job_id, allocation)]
