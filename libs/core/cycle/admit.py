"""Steps 2 and 3, admit: walk the tiers (debug work, the fast path; allocated work;
free work), and in each the allocations in rank order and their jobs in queue order,
placing every job that fits (best fit, gangs all or nothing: ``capacity.py``).

Nodes earmarked for a blocked job (``earmarks.py``) take only work that cannot delay it:
free work, debug work, and charged work that will be gone in time (``backfills``).
Allocated work leaves the debug headroom free (``PolicyConfig.debug_headroom``).
"""

from __future__ import annotations

from collections.abc import Collection

from libs.core.capacity import Fit, NoFit
from libs.core.cycle.nominate import reserved_fits
from libs.core.cycle.tell import wait
from libs.core.decisions import Decision, GangPart, Place, Protection
from libs.core.facts import Facts
from libs.core.ids import JobId, NodeId, batch_task_id
from libs.core.model import NodeKind, WorkClass
from libs.core.queues import Waiting
from libs.core.running import Tasks

# What a pass asks of capacity for a job: (GPU type, memory, node kinds, GPUs, parts,
# backfills). Capacity only shrinks during a pass, so a shape that did not fit is not
# tried again in it.
Shape = tuple[str, float, frozenset[NodeKind], int, int, bool]


def place_reserved(facts: Facts, *, earmarked: bool) -> list[Decision]:
    """Place the jobs with nodes reserved for them that fit now (``reserved_fits``)."""
    fits = reserved_fits(facts, earmarked=earmarked)
    return [d for job, fit in fits for d in place(facts, job, fit)]


def place_allocation(
    facts: Facts,
    tier: WorkClass,
    allocation: str,
    failed: set[Shape],
    rank: dict[str, int],
    *,
    headroom: bool = True,
) -> list[Decision]:
    """Place the allocation's jobs of the tier that fit, in queue order; a job that
    does not fit hears why. With ``headroom``, allocated work stops at its first job
    that would eat into the debug headroom."""
    decisions: list[Decision] = []
    capacity, reservations = facts.capacity, facts.reservations
    if not may_place(facts, tier, headroom=headroom):
        return decisions
    # Nominated jobs were placed before this. Earmarked nodes take only work that
    # cannot delay their job: free work (always preemptible), debug work (small and
    # short), and charged work that will be gone in time (``backfills``).
    all_reserved = reservations.reserved.keys()
    earmarked = reservations.earmarked()
    open_nodes = reservations.open_nodes() if earmarked else all_reserved
    reserved: Collection[NodeId] = all_reserved
    if tier is not WorkClass.ALLOCATED:
        reserved = open_nodes
    largest, node_size, whole = capacity.shape(open_nodes)

    def could_fit(gpus: int) -> bool:
        # A gang spans whole free nodes; anything else needs one free block.
        return gpus <= largest or node_size < gpus <= whole

    may_backfill = bool(earmarked) and tier is WorkClass.ALLOCATED
    last: tuple[int, int, JobId] | None = None  # the last job walked past
    walking = True
    while walking:
        walking = False  # unless a placement changes what fits: then walk on after it
        for job in facts.queues.candidates(tier, allocation, could_fit, last):
            last = job.key
            spec = job.spec
            if headroom and tier is WorkClass.ALLOCATED and not _leaves_headroom(facts, spec.gpus):
                return decisions
            need = (spec.gpu_type, spec.min_gpu_memory_gib, spec.node_kinds, spec.gpus, spec.parts)
            if (*need, False) in failed and (not may_backfill or (*need, True) in failed):
                continue  # its shape failed whether it backfills or not: no need to ask
            backfills = may_backfill and _backfills(facts, job, rank)
            shape: Shape = (*need, backfills)
            if shape in failed:
                continue
            fit = capacity.fit(spec, open_nodes if backfills else reserved)
            if isinstance(fit, NoFit):
                failed.add(shape)
                decisions += wait(facts, job, fit)
                continue
            decisions += place(facts, job, fit)
            if capacity.total_free == 0:
                return decisions
            largest, node_size, whole = capacity.shape(open_nodes)
            # ``earmarked`` is the live set: placing their job there releases them.
            may_backfill = bool(earmarked) and tier is WorkClass.ALLOCATED
            walking = True
            break
    return decisions


def may_place(facts: Facts, tier: WorkClass, *, headroom: bool = True) -> bool:
    """Whether a pass may place any job of the tier now: GPUs are free and, for
    allocated work, even the smallest job (1 GPU) would leave the debug headroom
    (an allocation's turn ends at its first job that would not)."""
    if not facts.capacity.total_free:
        return False
    return not (headroom and tier is WorkClass.ALLOCATED) or _leaves_headroom(facts, 1)


def _leaves_headroom(facts: Facts, gpus: int) -> bool:
    capacity = facts.capacity
    headroom = int(facts.config.debug_headroom * capacity.total_gpus)
    return capacity.total_free - gpus + facts.running.free_work_gpus >= headroom


def _backfills(facts: Facts, job: Waiting, rank: dict[str, int]) -> bool:
    """Whether charged work may run on earmarked nodes: it will be gone when their
    job likely starts, by its runtime estimate, or because its contract ends by then
    and that job ranks above it (and so may preempt it)."""
    unknown = len(rank)
    mine = rank.get(job.spec.allocation, unknown)
    now = facts.now
    estimate = facts.learned.estimate_s(job.spec)
    protect = min(job.spec.min_runtime_s, facts.config.max_min_runtime_s)
    for marked, start in facts.reservations.earmarks.items():
        if estimate is not None and now + estimate <= start:
            continue
        marked_rank = rank.get(facts.queues.jobs[marked].spec.allocation, unknown)
        if not (mine > marked_rank and now + protect <= start):
            return False
    return True


def place(facts: Facts, job: Waiting, fit: Fit) -> list[Decision]:
    """Start the job where it fits; each task says how the job is protected."""
    capacity, config = facts.capacity, facts.config
    facts.dequeue(job.job_id)
    tasks: Tasks = {}
    for rank, (node_id, gpus) in enumerate(fit.tasks):
        task_id = batch_task_id(job.job_id, job.attempt, rank if len(fit.tasks) > 1 else None)
        tasks[task_id] = (node_id, gpus)
        capacity.take(node_id, gpus)
    borrowed = facts.charges.borrows(job.spec, tasks)
    gang: tuple[GangPart, ...] = ()
    port = 0
    if len(fit.tasks) > 1:
        nodes = capacity.nodes
        gang = tuple(GangPart(n, nodes[n].address, len(gpus)) for n, gpus in fit.tasks)
        port = _rendezvous_port(facts, fit.tasks[0][0])
    estimate_s = facts.learned.estimate_s(job.spec)
    run = facts.running.place(job, tasks, facts.now, estimate_s, borrowed, port)
    facts.charges.count(run, +1)
    protection = run.protection(config)
    protected_s = run.protect_s(config) if protection is Protection.CONTRACT else 0.0
    return [
        Place(
            job.job_id,
            task_id,
            node_id,
            gpus,
            job.spec,
            protection=protection,
            protected_s=protected_s,
            gang=gang,
            master_port=port,
        )
        for task_id, (node_id, gpus) in tasks.items()
    ]


def _rendezvous_port(facts: Facts, node_id: NodeId) -> int:
    """The lowest of the policy's rendezvous ports that no gang whose rank 0 runs on
    ``node_id`` holds (there are more than a node has GPUs: 0 never happens)."""
    used = facts.running.ports_in_use(node_id)
    first, count = facts.config.rendezvous_port, facts.config.rendezvous_ports
    return next((p for p in range(first, first + count) if p not in used), 0)
