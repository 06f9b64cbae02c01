"""Preemption planning: the cheapest set of victims that frees room for one job.

Pure: it looks at a snapshot of running jobs and returns a plan, or None.
Plans are compared by the GPUs of allocated (charged) work they disturb, then
the busy ones among those, then all GPUs and jobs disturbed, then node ids.
A job that fits one node frees room on one node; a gang frees whole nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from libs.core.contract import RunningJob, victim_order, victims_of
from libs.core.ids import NodeId
from libs.core.model import JobSpec

_Cost = tuple[int, int, int, int]


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
) -> Plan | None:
    """``candidate_nodes`` are (node id, GPU count, free GPUs) of nodes the job could use."""
    nodes = list(candidate_nodes)
    node_size = max((size for _, size, _ in nodes), default=0)
    if node_size == 0:
        return None
    may_take = victims_of(waiting, rank, now)
    if waiting.gpus > node_size:
        return _whole_nodes(waiting, nodes, node_size, running_on, may_take)
    best: tuple[_Cost, NodeId, tuple[RunningJob, ...]] | None = None
    for node_id, size, free in nodes:
        if size < waiting.gpus or free >= waiting.gpus:
            continue
        allowed = list(filter(may_take, running_on.get(node_id, ())))
        if free + sum(v.gpus for v in allowed) < waiting.gpus:
            continue  # too little room even with every victim allowed (most nodes, mostly)
        allowed.sort(key=lambda v: victim_order(v, rank))
        chosen: list[RunningJob] = []
        room = free
        for victim in allowed:
            if room >= waiting.gpus:
                break
            chosen.append(victim)
            room += victim.gpus
        if room < waiting.gpus:
            continue
        option = (_cost(chosen), node_id, tuple(chosen))
        if best is None or option[:2] < best[:2]:
            best = option
    return Plan((best[1],), best[2]) if best else None


def _whole_nodes(
    waiting: JobSpec,
    nodes: list[tuple[NodeId, int, int]],
    node_size: int,
    running_on: Mapping[NodeId, Iterable[RunningJob]],
    may_take: Callable[[RunningJob], bool],
) -> Plan | None:
    needed = -(-waiting.gpus // node_size)
    freeable: list[tuple[NodeId, tuple[RunningJob, ...]]] = []
    for node_id, size, free in nodes:
        if size != node_size:
            continue
        victims = tuple(running_on.get(node_id, ()))
        if sum(v.gpus for v in victims) + free < size:
            continue  # something else holds GPUs there (a gang, or a stopping job)
        if all(map(may_take, victims)):
            freeable.append((node_id, victims))
    if len(freeable) < needed:
        return None  # most plans: priced only when there are enough nodes
    chosen = sorted((_cost(victims), node_id, victims) for node_id, victims in freeable)[:needed]
    victims = tuple(v for _, _, vs in chosen for v in vs)
    if not victims:
        return None  # whole nodes are free already: no preemption needed
    return Plan(tuple(sorted(node for _, node, _ in chosen)), victims)


def _cost(victims: Iterable[RunningJob]) -> _Cost:
    victims = list(victims)
    paid = [v for v in victims if v.spec.allocated]
    return (
        sum(v.gpus for v in paid),
        sum(v.gpus for v in paid if not v.idle),
        sum(v.gpus for v in victims),
        len(victims),
    )
