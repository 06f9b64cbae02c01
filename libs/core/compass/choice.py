"""Choosing one task's GPU in a plan without weighing every GPU in full.

``Arrivals`` says when the task's inputs reach each node, ``Shortlist`` leaves
out the GPUs sure not to start it first, and ``Choice`` weighs the rest: the
earliest start wins (with Compass, the model load and the eviction penalty
added to when the GPU would take it), ties to the GPU first in the planner's
order (``order``: the lowest id, unless several planners share the GPUs).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from libs.core.compass.cache import load_ms, penalty_ms
from libs.core.compass.order import GpuOrder
from libs.core.compass.timeline import GpuState, Timeline
from libs.core.compass.workflow import Costs, Task
from libs.core.ids import NodeId


class Arrivals:
    """When a task's inputs reach each node: an input moves for free within its node
    and for the same transfer time between any two nodes, so at a node the latest is
    the latest that ended there or the latest from elsewhere, transfer included. A
    few maxima over the parents, then O(1) for each node asked."""

    def __init__(self, now_ms: float, moved_ms: float, local: dict[NodeId, float]) -> None:
        self.now_ms = now_ms
        self.moved_ms = moved_ms
        self.local = local  # node -> when its last parent there ends
        # The latest parent end and, on another node than that one's, the next latest.
        self.top_node: NodeId | None = None
        self.top, self.runner_up = -math.inf, -math.inf
        for node_id, end in local.items():
            if end > self.top:
                self.top_node, self.top, self.runner_up = node_id, end, self.top
            elif end > self.runner_up:
                self.runner_up = end
        self.elsewhere = max(now_ms, self.top + moved_ms)  # at a node without parents

    def at(self, node_id: NodeId) -> float:
        local = self.local.get(node_id)
        if local is None:
            return self.elsewhere
        other = self.runner_up if node_id == self.top_node else self.top
        return max(self.now_ms, local, other + self.moved_ms)


class Shortlist:
    """The GPUs a plan weighs for a task, less those sure not to start it first.

    Weighing every GPU for every task costs tasks × GPUs; this leaves out, without
    changing any choice (the earliest start wins, ties the first in ``order``):
    - of GPUs with nothing queued that are alike (models, memory, when free) and
      get the task's inputs at the same time (on the same node, or on none of its
      parents' nodes), all but the first in order: they would start it alike;
    - GPUs with a queue that would take the task later than the best start found
      (``Timeline.earliest_begin``, weighed in that order): a load and an eviction
      only add to it.
    """

    def __init__(
        self, gpus: Sequence[GpuState], lines: dict[str, Timeline], order: GpuOrder
    ) -> None:
        self.lines = lines
        self.node_of = {g.gpu_id: g.node_id for g in gpus}
        self.order = order
        # alike -> node -> ids with nothing queued, first in order first
        self.idle: dict[tuple[object, ...], dict[NodeId, list[str]]] = {}
        self.queued: dict[str, None] = {}
        for gpu in gpus:
            if len(lines[gpu.gpu_id]):
                self.queued[gpu.gpu_id] = None
            else:
                alike = (gpu.free_at_ms, tuple(gpu.resident.items()), lines[gpu.gpu_id].memory_mb)
                on_node = self.idle.setdefault(alike, {}).setdefault(gpu.node_id, [])
                bisect.insort(on_node, gpu.gpu_id, key=order.key)

    def weigh(self, task: Task, arrivals: Arrivals, start: Callable[[str, float], float]) -> None:
        """Call ``start(gpu id, best start so far)`` for each GPU on the shortlist;
        it returns the best start after weighing that GPU."""
        best = math.inf
        key = self.order.key
        for by_node in self.idle.values():
            elsewhere = ""  # the first in order off the parents' nodes
            for node, ids in by_node.items():
                if not ids:
                    continue
                if node in arrivals.local:
                    best = start(ids[0], best)
                elif not elsewhere or key(ids[0]) < key(elsewhere):
                    elsewhere = ids[0]
            if elsewhere:
                best = start(elsewhere, best)
        lines, node_of, ready = self.lines, self.node_of, arrivals.at
        bounds = sorted((lines[g].earliest_begin(ready(node_of[g])), g) for g in self.queued)
        for bound, gpu_id in bounds:
            # A run so short that it could round away at a busy place: no shortcut.
            if bound <= best or not task.run_ms > math.ulp(bound):
                best = start(gpu_id, best)

    def changed(self, gpu_id: str) -> None:
        """The GPU's timeline got a task."""
        if gpu_id not in self.queued:
            for by_node in self.idle.values():
                ids = by_node.get(self.node_of[gpu_id], [])
                if gpu_id in ids:
                    ids.remove(gpu_id)
                    break
            self.queued[gpu_id] = None


@dataclass
class Choice:
    """The GPU a plan gives one task: the earliest start, ties to the first in order."""

    costs: Costs
    aware: bool  # of loads and caches (all but heft)
    task: Task
    arrivals: Arrivals
    lines: dict[str, Timeline]
    node_of: dict[str, NodeId]
    insertion: bool
    order: GpuOrder
    # (start, gpu id, place in its timeline, ready, begin, load)
    best: tuple[float, str, int, float, float, float] | None = None

    def weigh(self, gpu_id: str, limit: float) -> float:
        """Weigh one GPU against the best start so far (``limit``); the best after it."""
        task, line = self.task, self.lines[gpu_id]
        ready = self.arrivals.at(self.node_of[gpu_id])
        # A load and an eviction only add to when the GPU would take it: a GPU
        # that takes it later than the best start so far is not looked at further.
        found = line.earliest(task, ready, self.insertion, limit)
        if found is None:
            return limit
        k, begin = found
        start = begin
        cache = line.cache(k)
        load = load_ms(self.costs, task, cache, line.memory_mb)
        if self.aware:
            start += load + penalty_ms(self.costs, task, cache, line.memory_mb)
        key = self.order.key
        if self.best is None or (start, key(gpu_id)) < (self.best[0], key(self.best[1])):
            self.best = (start, gpu_id, k, ready, begin, load)
        return self.best[0]
