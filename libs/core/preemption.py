"""Preemption planning: the cheapest set of victims that frees room for one job.

Pure: it looks at a snapshot of running jobs and returns a plan, or None.
A plan uses one node; across nodes it prefers plans that disturb the fewest
GPUs of allocated (charged) work, then the fewest busy ones among those, then
the fewest GPUs and jobs overall, then the node id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from libs.core.contract import RunningJob, may_preempt, victim_order
from libs.core.model import JobSpec


@dataclass(frozen=True)
class Plan:
    node_id: str
    victims: tuple[RunningJob, ...]


def plan_preemption(
    waiting: JobSpec,
    candidate_nodes: Iterable[tuple[str, int, int]],
    running_on: Mapping[str, Iterable[RunningJob]],
    rank: dict[str, int],
    now: float,
) -> Plan | None:
    """``candidate_nodes`` are (node id, GPU count, free GPUs) of nodes the job could use."""
    best: tuple[tuple[int, int, int, int, str], Plan] | None = None
    for node_id, size, free in candidate_nodes:
        if size < waiting.gpus:
            continue
        allowed = sorted(
            (v for v in running_on.get(node_id, ()) if may_preempt(waiting, v, rank, now)),
            key=lambda v: victim_order(v, rank),
        )
        chosen: list[RunningJob] = []
        room = free
        for victim in allowed:
            if room >= waiting.gpus:
                break
            chosen.append(victim)
            room += victim.gpus
        if room < waiting.gpus or not chosen:
            continue
        paid = [v for v in chosen if v.spec.allocated]
        score = (
            sum(v.gpus for v in paid),
            sum(v.gpus for v in paid if not v.idle),
            sum(v.gpus for v in chosen),
            len(chosen),
            node_id,
        )
        if best is None or score < best[0]:
            best = (score, Plan(node_id, tuple(chosen)))
    return best[1] if best else None
