"""Holds: a blocked job's turn when no preemption can give it room now.

A gang needs whole nodes, and a cluster full of small jobs rarely frees one: as
GPUs free, smaller jobs of other teams would take them and the gang would wait
forever. So when a blocked job near the head of the fair-share order cannot be
given room without throwing work away, it *holds* the nodes that will have room
for it soonest, and only work that cannot delay it runs there meanwhile
(``Scheduler`` decides which).

When a node's work lets go, as the holder sees it (``release_time``): now for work
being stopped or that it may preempt; at the end of a contract for protected work
it may preempt afterwards; otherwise at the work's likely end (its runtime estimate
when placed, ``estimates.py``), or never that anyone knows. Pure: values in, a
value out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from libs.core.contract import RunningJob
from libs.core.ids import NodeId
from libs.core.model import JobSpec


@dataclass(frozen=True)
class Hold:
    node_ids: tuple[NodeId, ...]
    starts_at: float  # when the last of them likely has room


def release_time(
    victim: RunningJob,
    may_take_now: Callable[[RunningJob], bool],
    may_take_later: Callable[[RunningJob], bool],
    now: float,
) -> float:
    """When the holder likely gets ``victim``'s GPUs without throwing work away: now if
    it may take them and the victim resumes, at the end of its contract if it may take
    them then, else at its likely end: infinite when unknown, or once it has outrun its
    estimate (it may run on for any time)."""
    resumes = victim.lost_gpu_s(now) == 0
    if resumes and may_take_now(victim):
        return now
    end = victim.likely_end if victim.likely_end > now else math.inf
    if resumes and may_take_later(victim):
        return min(max(victim.protected_until, now), end)
    return end


def soonest_nodes(
    waiting: JobSpec,
    candidate_nodes: Iterable[tuple[NodeId, int, int]],
    releases: Mapping[NodeId, Iterable[tuple[float, int]]],
) -> Hold | None:
    """The nodes that will hold ``waiting`` soonest: one node with room for it, or the
    fewest whole nodes for a gang. ``candidate_nodes`` are (node id, GPU count, GPUs
    free or being freed); ``releases`` (when, GPUs) of the other work on each node.
    None when no such nodes are known to free at all."""
    nodes = list(candidate_nodes)
    node_size = max((size for _, size, _ in nodes), default=0)
    if node_size == 0:
        return None
    gang = waiting.gpus > node_size
    need = node_size if gang else waiting.gpus
    count = -(-waiting.gpus // node_size) if gang else 1
    options: list[tuple[float, NodeId]] = []
    for node_id, size, free in nodes:
        if size < need or (gang and size != node_size):
            continue
        room, ready = free, -math.inf
        for end, gpus in sorted(releases.get(node_id, ())):
            if room >= need:
                break
            room, ready = room + gpus, end
        if room >= need and ready < math.inf:
            options.append((ready, node_id))
    if len(options) < count:
        return None
    chosen = sorted(options)[:count]
    return Hold(tuple(sorted(node for _, node in chosen)), chosen[-1][0])
