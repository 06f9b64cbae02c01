"""Earmarks: a blocked job's turn when no preemption can give it room now.

A gang needs whole nodes, and a cluster full of small jobs rarely frees one: as
GPUs free, smaller jobs of other teams would take them and the gang would wait
forever. So when a blocked job near the head of the fair-share order cannot be
given room without throwing work away, the nodes that will have room for it soonest
are *earmarked* for it, and only work that cannot delay it runs there meanwhile
(``cycle/admit.py`` decides which).

When a node's work lets go, as the earmark's job sees it (``release_time``): now for work
being stopped or that it may preempt; at the end of a contract for protected work
it may preempt afterwards; otherwise at the work's likely end (its runtime estimate
when placed, ``estimates.py``), or never that anyone knows. Pure: values in, a
value out.

Finding the soonest nodes weighs each node's work, and an earmark looks at every node. So
nodes are weighed in the order of a bound that needs no weighing (``earliest``: no
work lets go before its contract ends or its likely end, whichever is first), and the
search stops once the rest could not free in time to be chosen.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from libs.core.contract import RunningJob
from libs.core.ids import NodeId
from libs.core.model import JobSpec
from libs.core.rooms import Room

# A node's preemptible work as ``earliest`` reads it: the latest start of work that cannot
# resume, and when each of its GPUs may be let go at the soonest, sorted.
Floors = tuple[float, tuple[float, ...]]


@dataclass(frozen=True)
class Earmark:
    node_ids: tuple[NodeId, ...]
    starts_at: float  # when the last of them likely has room


def release_time(
    victim: RunningJob,
    may_take_now: Callable[[RunningJob], bool],
    may_take_later: Callable[[RunningJob], bool],
    now: float,
) -> float:
    """When the waiting job likely gets ``victim``'s GPUs without throwing work away: now if
    it may take them and the victim resumes, at the end of its contract (or of its turn
    on borrowed GPUs) if it may take them then, else at its likely end: infinite when
    unknown, or once it has outrun its estimate (it may run on for any time)."""
    resumes = victim.lost_gpu_s(now) == 0
    if resumes and may_take_now(victim):
        return now
    end = victim.likely_end if victim.likely_end > now else math.inf
    if resumes and may_take_later(victim):
        return min(max(victim.protected_until, victim.borrowed_until, now), end)
    return end


def soonest_nodes(
    waiting: JobSpec,
    candidate_nodes: Iterable[tuple[NodeId, int, int, Floors | None]],
    releases: Callable[[NodeId], Iterable[tuple[float, int]]],
    now: float,
) -> Earmark | None:
    """The nodes that will hold ``waiting`` soonest: one node with room for it, one with
    room for a part on each of its named nodes, or the fewest whole nodes for a gang.
    ``candidate_nodes`` are (node id, GPU count, GPUs free or being freed, the
    ``Floors`` of its other work or None); ``releases`` (when, GPUs) of that work. Nodes
    are weighed in the order of ``earliest`` (no later than ``releases`` frees what is
    needed; -inf for a node without floors), and no further once the rest cannot free in
    time to be chosen. None when no such nodes are known to free at all."""
    nodes = candidate_nodes if isinstance(candidate_nodes, list) else list(candidate_nodes)
    node_size = max((size for _, size, _, _ in nodes), default=0)
    if node_size == 0:
        return None
    # A part on each of several nodes, whole nodes for a gang larger than one, or one node.
    gang = waiting.parts == 1 and waiting.gpus > node_size
    need = node_size if gang else waiting.block
    count = -(-waiting.gpus // node_size) if gang else waiting.parts
    # A heap, not a sorted list: the search mostly stops after a few nodes.
    order = [
        (-math.inf if bounds is None else earliest(bounds, need - free, now), node_id, free)
        for node_id, size, free, bounds in nodes
        if (size == node_size if gang else size >= need)
    ]
    heapq.heapify(order)
    options: list[tuple[float, NodeId]] = []  # sorted
    while order:
        soonest, node_id, free = heapq.heappop(order)
        if len(options) >= count and soonest > options[count - 1][0]:
            break  # in order: none of the rest frees in time to be chosen
        room, ready = free, -math.inf
        for end, gpus in sorted(releases(node_id)):
            if room >= need:
                break
            room, ready = room + gpus, end
        if room >= need and ready < math.inf:
            bisect.insort(options, (ready, node_id))
    if len(options) < count:
        return None
    chosen = options[:count]
    return Earmark(tuple(sorted(node for _, node in chosen)), chosen[-1][0])


def floors(rooms: Iterable[Room]) -> Floors:
    """``Floors`` of a node's preemptible work (``rooms.Room`` entries)."""
    latest_start = -math.inf
    times: list[float] = []
    for protected_until, gpus, lossless_until, likely_end in rooms:
        if lossless_until < math.inf:  # cannot resume: it loses nothing only until its start
            latest_start = max(latest_start, lossless_until)
            times += [likely_end] * gpus
        else:
            times += [min(protected_until, likely_end)] * gpus
    return latest_start, tuple(sorted(times))


def earliest(node: Floors, gpus: int, now: float) -> float:
    """No later than when ``release_time`` lets ``gpus`` of the node's GPUs go, for any
    waiting job: work that resumes at the end of its contract or its likely end, whichever
    comes first; work that cannot resume at its likely end, once it started before
    ``now`` (until then it may go at once). -inf when ``gpus`` are free already."""
    latest_start, times = node
    if gpus <= 0 or now <= latest_start:
        return -math.inf
    return times[gpus - 1] if gpus <= len(times) else math.inf
