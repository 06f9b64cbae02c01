"""Preemption planning: the cheapest set of victims that frees room for one job.

Pure: it looks at a snapshot of running jobs and returns a plan, or None.
Plans are compared by the work they throw away (GPU-seconds since the last
checkpoint), then the GPUs of allocated (charged) work they disturb, the busy
ones among those, all GPUs and jobs disturbed, then node ids. A job that fits
one node frees room on one node; a gang frees whole nodes, the fewest, in one step.
A running gang is a victim as a whole: stopping it frees every node it spans.

A *lossless* plan stops only work that loses nothing: work that resumes (it saves
at the stop signal). Work that cannot resume loses all it did, and likely runs on
as long again as it has run (run times are heavy-tailed), so stopping it would
throw away about what the waiting job wins by not waiting. The scheduler tries a
lossless plan first, waits a while for one (an earmark) and only then throws work
away: single-node work, never a whole gang's, and in all at most ``loss_cap_s`` × the
waiting job's GPUs (its minimum runtime or the time it has waited, whichever is more).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from libs.core.contract import Reclaims, RunningJob, victim_order, victims_of
from libs.core.ids import JobId, NodeId
from libs.core.model import JobSpec

_Cost = tuple[float, int, int, int, int]


@dataclass(frozen=True)
class Plan:
    node_ids: tuple[NodeId, ...]
    victims: tuple[RunningJob, ...]


def plan_preemption(
    waiting: JobSpec,
    candidate_nodes: Iterable[tuple[NodeId, int, int]],
    running_on: Mapping[NodeId, Iterable[RunningJob]],
    rank: dict[str, int],
    now: float,
    *,
    lossless: bool = False,
    loss_cap_s: float = math.inf,
    room_bound: Callable[[NodeId], int] | None = None,
    node_size: int | None = None,
    ordered: bool = False,
    reclaims: Reclaims = None,
) -> Plan | None:
    """``candidate_nodes`` are (node id, GPU count, free GPUs) of nodes the job could use.
    A lossy plan (not ``lossless``) may also stop single-node work that cannot resume,
    throwing away at most ``loss_cap_s`` × the job's GPUs of work in all. ``room_bound``
    (``RunningWork.room_bound``), when given, bounds the GPUs a node's victims may free
    from above, so that nodes short of room are skipped without weighing each victim:
    the plan is the same with or without it. ``node_size``, when given, is the most GPUs
    of any node the job could use, and ``candidate_nodes`` may then leave out the nodes a
    plan skips: the plan is the same. ``ordered``: they come by free GPUs (most first),
    then by id, and only as far as the plan reads them (a job that fits one node stops
    at the first node where no plan can cost less than the best so far). ``reclaims``:
    whose borrowed GPUs it may take back (``contract.Reclaims``)."""
    if node_size is None:
        candidate_nodes = list(candidate_nodes)
        node_size = max((size for _, size, _ in candidate_nodes), default=0)
    if node_size == 0:
        return None
    by_contract = victims_of(waiting, rank, now, reclaims=reclaims)

    cap = 0.0 if lossless else loss_cap_s * waiting.gpus

    def may_take(victim: RunningJob) -> bool:
        if now > victim.lossless_until:  # most lose nothing
            lost = victim.lost_gpu_s(now)
            if lost and (victim.gpus < victim.spec.gpus or lost > cap):
                return False  # a gang's work, or more than the plan may lose in all
        return by_contract(victim)

    def short(node_id: NodeId, free: int, needed: int) -> bool:
        return room_bound is not None and free + room_bound(node_id) < needed

    if waiting.parts > 1:
        return _parts(waiting, list(candidate_nodes), running_on, may_take, short, rank, now, cap)
    if waiting.gpus > node_size:
        nodes = list(candidate_nodes)
        plan = _whole_nodes(waiting, nodes, node_size, running_on, may_take, short, now)
        if plan is None or _cost(plan.victims, now)[0] > cap:
            return None
        return plan
    best: tuple[_Cost, NodeId, tuple[RunningJob, ...]] | None = None
    for node_id, size, free in candidate_nodes:
        if size < waiting.gpus or free >= waiting.gpus or short(node_id, free, waiting.gpus):
            continue
        if best is not None:
            # No plan costs less than stopping one job, that loses nothing and is not
            # charged, of the GPUs missing: nor, ``ordered``, at any node after this one.
            if ((0.0, 0, 0, waiting.gpus - free, 1), node_id) > best[:2]:
                if ordered:
                    break
                continue
            if (_least_cost(running_on.get(node_id, ()), waiting.gpus - free), node_id) > best[:2]:
                continue  # no plan here can cost less: most nodes, once a cheap plan is found
        allowed = list(filter(may_take, running_on.get(node_id, ())))
        if free + sum(v.gpus for v in allowed) < waiting.gpus:
            continue  # too little room even with every victim allowed (most nodes, mostly)
        chosen = _first_room(allowed, free, waiting.gpus, rank, now)
        if chosen is None:
            continue
        cost = _cost(chosen, now)
        if cost[0] > cap:
            continue
        option = (cost, node_id, tuple(chosen))
        if best is None or option[:2] < best[:2]:
            best = option
    return Plan((best[1],), best[2]) if best else None


def costs_least(plan: Plan, now: float) -> bool:
    """Whether no plan can cost less: it throws no work away and stops no charged work."""
    return _cost(plan.victims, now)[:2] == (0.0, 0)


def _whole_nodes(
    waiting: JobSpec,
    nodes: list[tuple[NodeId, int, int]],
    node_size: int,
    running_on: Mapping[NodeId, Iterable[RunningJob]],
    may_take: Callable[[RunningJob], bool],
    short: Callable[[NodeId, int, int], bool],
    now: float,
) -> Plan | None:
    needed = -(-waiting.gpus // node_size)
    freeable: dict[NodeId, tuple[RunningJob, ...]] = {}
    for node_id, size, free in nodes:
        if size != node_size or short(node_id, free, size):
            continue
        victims = tuple(running_on.get(node_id, ()))
        if sum(v.gpus for v in victims) + free < size:
            continue  # something else holds GPUs there (a job being stopped)
        if all(map(may_take, victims)):
            freeable[node_id] = victims
    if len(freeable) < needed:
        return None  # most plans: priced only when there are enough nodes
    chosen: list[NodeId] = []
    stopped: dict[JobId, RunningJob] = {}
    if not any(v.gpus < v.spec.gpus for victims in freeable.values() for v in victims):
        # No gang among the victims: each node's cost stands alone.
        ranked = sorted((_cost(victims, now), node_id) for node_id, victims in freeable.items())
        freeable = {node_id: freeable[node_id] for _, node_id in ranked[:needed]}

    # Greedy by the cost each node adds: a gang stopped for one node frees its others
    # for nothing more. A node's cost changes only when a job on it is stopped.
    def adds(node_id: NodeId) -> _Cost:
        return _cost([v for v in freeable[node_id] if v.job_id not in stopped], now)

    costs = {node_id: adds(node_id) for node_id in freeable}
    nodes_of: dict[JobId, list[NodeId]] = {}
    for node_id, victims in freeable.items():
        for victim in victims:
            nodes_of.setdefault(victim.job_id, []).append(node_id)
    while len(chosen) < needed:
        _, node_id = min((cost, node_id) for node_id, cost in costs.items())
        chosen.append(node_id)
        del costs[node_id]
        touched: set[NodeId] = set()
        for victim in freeable.pop(node_id):
            if victim.job_id not in stopped:
                stopped[victim.job_id] = victim
                touched.update(nodes_of[victim.job_id])
        for other in touched & costs.keys():
            costs[other] = adds(other)
    if not stopped:
        return None  # whole nodes are free already: no preemption needed
    return Plan(tuple(sorted(chosen)), tuple(stopped.values()))


def _first_room(
    allowed: list[RunningJob], free: int, need: int, rank: dict[str, int], now: float
) -> list[RunningJob] | None:
    """The victims a node stops, first in ``victim_order``, until ``free`` GPUs and
    theirs make ``need``; None when all of them cannot."""
    chosen: list[RunningJob] = []
    room = free
    for victim in sorted(allowed, key=lambda v: victim_order(v, rank, now)):
        if room >= need:
            break
        chosen.append(victim)
        room += victim.gpus
    return chosen if room >= need else None


def _parts(
    waiting: JobSpec,
    nodes: list[tuple[NodeId, int, int]],
    running_on: Mapping[NodeId, Iterable[RunningJob]],
    may_take: Callable[[RunningJob], bool],
    short: Callable[[NodeId, int, int], bool],
    rank: dict[str, int],
    now: float,
    cap: float,
) -> Plan | None:
    """Room for a job on named nodes: a part's GPUs on each of ``waiting.parts`` distinct
    nodes, each node's room freed as a one-node job's would be, the cheapest nodes
    (those with room already cost nothing). None when there are not enough such nodes,
    the plan would throw away more than ``cap``, or nothing needs stopping."""
    per = waiting.block
    options: list[tuple[_Cost, NodeId, tuple[RunningJob, ...]]] = []
    for node_id, size, free in nodes:
        if size < per or short(node_id, free, per):
            continue
        allowed = list(filter(may_take, running_on.get(node_id, ())))
        chosen = _first_room(allowed, free, per, rank, now)
        if chosen is not None:
            options.append((_cost(chosen, now), node_id, tuple(chosen)))
    if len(options) < waiting.parts:
        return None
    options.sort(key=lambda option: option[:2])
    picked = options[: waiting.parts]
    victims = {v.job_id: v for _, _, chosen in picked for v in chosen}
    if not victims or _cost(victims.values(), now)[0] > cap:
        return None
    return Plan(tuple(sorted(node_id for _, node_id, _ in picked)), tuple(victims.values()))


def _least_cost(victims: Iterable[RunningJob], missing: int) -> _Cost:
    """No plan that frees ``missing`` GPUs among ``victims`` (a node's) costs less: what
    free work and idle charged work there cannot make up is charged, and busy."""
    free_work = idle = 0
    for v in victims:
        if not v.spec.allocated:
            free_work += v.gpus
        elif v.idle:
            idle += v.gpus
    charged = max(missing - free_work, 0)
    return (0.0, charged, max(charged - idle, 0), missing, 1)


def _cost(victims: Iterable[RunningJob], now: float) -> _Cost:
    jobs = {v.job_id: v for v in victims}.values()  # a gang counts once
    paid = [v for v in jobs if v.spec.allocated]
    return (
        sum(v.lost_gpu_s(now) for v in jobs),
        sum(v.spec.gpus for v in paid),
        sum(v.spec.gpus for v in paid if not v.idle),
        sum(v.spec.gpus for v in jobs),
        len(jobs),
    )
