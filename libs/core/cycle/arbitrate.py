"""Step 0, serving arbitration: how GPUs move between workflow serving and batch work.
The one code of the cycle that touches the serving pool (``compass/pool.py``).

Idle serving GPUs past their time go back to batch work, the pool grows onto freed
GPUs (workflows take them before any batch tier: the fast path), a backed-up pool
takes GPUs back from batch work it may stop (``reclaim``), and workflows no GPU could
take are planned again. The other way, a blocked charged job takes idle serving GPUs
held beyond their share (``yield_serving``, asked by the preempt step).
"""

from __future__ import annotations

from collections import Counter

from libs.core.capacity import Fit
from libs.core.compass.serving import GpuKey
from libs.core.contract import RunningJob, victim_order, victims_for
from libs.core.cycle.admit import place
from libs.core.decisions import Decision
from libs.core.endings import preempt
from libs.core.facts import Facts, Reclaim
from libs.core.ids import JobId, NodeId
from libs.core.limits import MAX_GANG_NODES
from libs.core.model import WorkClass
from libs.core.queues import Waiting


def arbitrate(facts: Facts) -> list[Decision]:
    """Serving's turn, before any batch tier's."""
    serving, now_ms = facts.serving, facts.now_ms
    decisions = serving.release_idle(now_ms)
    decisions += serving.grow(now_ms)
    decisions += _reclaim(facts)
    if serving.waiting:
        decisions += serving.retry(now_ms)
    return decisions


def settle(facts: Facts) -> None:
    """After the pass: the warm reserve is sized by what batch work left free."""
    facts.serving.pool.settle()


def measure(facts: Facts) -> None:
    """After every input: the GPUs serving keeps busy from now."""
    facts.serving.pool.measure(facts.now_ms)


def held_by_allocation(facts: Facts) -> Counter[str]:
    """Serving GPUs held now, by the allocation charged for each."""
    return Counter(facts.serving.pool.held.values())


def serving_gpus(facts: Facts) -> int:
    """GPUs held for workflows now (taken from batch work)."""
    return len(facts.serving.pool)


def stalled(facts: Facts) -> bool:
    """Whether the serving pool is backed up and its last look for a job it may stop
    found none (and none is stopping for it): it grows only onto GPUs batch work
    frees. Work that started since is looked at in the next pass."""
    wanted = facts.serving.pool.wanted
    last = facts.no_victim.value
    return (
        wanted is not None
        and facts.reclaiming.value is None
        and last is not None
        and last[0] == wanted
    )


def _reclaim(facts: Facts) -> list[Decision]:
    """A backed-up serving pool with no free GPU to grow onto stops one job on a
    GPU it can use, as its allocation's own work could (free work at once, charged
    work ranked below it and past its contract that resumes, losing nothing); the
    pool takes its GPUs as they free (``endings.task_ended``). One at a time: none
    while the last one stops. Among those that lose the least, the one that frees
    the most of what the pool is short (``Pool.shortfall``) goes first: a burst is
    met in a grace or two, not a grace per GPU."""
    pool, running, now = facts.serving.pool, facts.running, facts.now
    wanted = pool.wanted
    if wanted is None or facts.reclaiming.value is not None:
        return []
    tried = (wanted, running.version)
    if facts.no_victim.value == tried:
        return []
    fits, reserved, capacity = pool.fits, facts.reservations.reserved, facts.capacity

    def open_node(node_id: NodeId) -> bool:
        return node_id not in reserved and not capacity.is_cordoned(node_id)

    def usable_gpus(job_id: JobId) -> int:
        """The GPUs stopping the job frees that the pool can take."""
        return sum(
            fits((node_id, index), wanted.gpu_type, wanted.need_mb)
            for node_id, gpus in running.jobs[job_id].tasks.values()
            if open_node(node_id)
            for index in gpus
        )

    frees: dict[JobId, tuple[RunningJob, int]] = {}  # a gang is listed on each node
    for node_id, jobs in running.preemptible_by_node().items():
        for victim in jobs if open_node(node_id) else ():
            if victim.job_id not in frees and (gpus := usable_gpus(victim.job_id)):
                frees[victim.job_id] = (victim, gpus)
    usable = [victim for victim, _ in frees.values()]
    victims = [v for v in usable if not v.spec.allocated]  # no rank needed: the common case
    rank: dict[str, int] = {}
    if not victims and usable:
        rank = facts.charges.rank(now)
        may_take = victims_for(wanted.allocation, rank, now)
        # Only work that resumes: one that cannot ends when stopped, even as it starts.
        victims = [v for v in usable if may_take(v) and v.spec.resumable]
    if not victims:
        facts.no_victim.value = tried
        return []
    short = pool.shortfall()
    victim = min(
        victims,
        key=lambda v: (
            v.lost_gpu_s(now),
            -min(frees[v.job_id][1], short),
            victim_order(v, rank, now),
        ),
    )
    facts.reclaiming.value = Reclaim(victim.job_id, wanted.allocation)
    return preempt(facts, victim.job_id, "", wanted.allocation)


def yield_serving(facts: Facts, job: Waiting, rank: dict[str, int]) -> list[Decision]:
    """Budget pressure on serving: a blocked charged job takes idle serving GPUs held
    for allocations past their share (borrowed, as charged work placed there is) and,
    unless it is debug work, ranked below its own (``contract.victims_for``'s rule),
    on the nodes where they make room for it with the fewest given back: the one
    node a job that fits on one needs, or the whole nodes a gang lacks
    (``Capacity.fit``'s rule), each share counted over all of them. The cheapest
    victims: they lose nothing. Never the ``serving_reserve_min`` warm GPUs
    (``Pool.idle_by_node``). Placed at once, or nothing."""
    spec, capacity, charges = job.spec, facts.capacity, facts.charges
    idle = facts.serving.pool.idle_by_node()
    if not idle or not spec.allocated:
        return []
    nodes = capacity.schedulable(spec)
    if not nodes:
        return []  # no node may take it (its type, or all cordoned)
    size = max(nodes.values())
    blocked = facts.reservations.blocked_for(job.job_id)
    per_node, wanted = spec.gpus, 1
    if spec.parts > 1:
        return []  # serving's GPUs yield to one-node jobs and whole-node gangs only
    if spec.gpus > size:  # a gang: whole nodes of the largest size
        needed = -(-spec.gpus // size)
        if needed > MAX_GANG_NODES:
            return []
        whole = sum(
            1
            for node_id, count in nodes.items()
            if count == size and node_id not in blocked and len(capacity.free(node_id)) == size
        )
        per_node, wanted = size, needed - whole
    rooms = sorted(
        (per_node - len(capacity.free(node_id)), node_id)
        for node_id in idle
        if nodes.get(node_id, 0) >= per_node and node_id not in blocked
    )
    debug = spec.work_class is WorkClass.DEBUG
    unknown = len(rank)
    own = rank.get(spec.allocation, unknown)
    # What each holder holds beyond its share, priced, less what this job takes.
    beyond: dict[str, float] = {}

    def borrowed(holder: str) -> float:
        if not debug and rank.get(holder, unknown) <= own:
            return 0.0
        if holder not in beyond:
            beyond[holder] = charges.beyond_share(holder)
        return beyond[holder]

    given: list[GpuKey] = []
    made = 0  # nodes given room
    for need, node_id in rooms:
        if made == wanted:
            break
        price = charges.price_of(node_id)
        left = {holder: borrowed(holder) for _, holder in idle[node_id]}
        keys: list[GpuKey] = []
        for key, holder in idle[node_id]:
            if len(keys) == need:
                break
            if left[holder] > 1e-9:
                left[holder] -= price
                keys.append(key)
        if 0 < need == len(keys):
            beyond.update(left)
            given += keys
            made += 1
    if made < wanted or not given:
        return []
    decisions = facts.serving.give_back(given)
    fit = capacity.fit(spec, blocked)
    if isinstance(fit, Fit):  # always: those nodes have room for it now
        decisions += place(facts, job, fit)
    return decisions
