"""Room: at most how many GPUs stopping a node's running work may free, and when.

``RunningWork`` keeps each node's preemptible jobs as ``Room`` entries, sorted by when
their contract stops protecting them. ``bound`` reads them: at a given time, the GPUs of
the jobs no longer protected (and, losslessly, that lose nothing when stopped). The
victim rules (``preemption.plan_preemption``) only ever take fewer, so a plan skips a
node short of room without weighing its jobs.

On a full cluster most nodes are short of room for most jobs, yet bounding each one's
costs a pass over all nodes for every plan. ``RoomIndex`` keeps nodes by the most GPUs
their bound may reach at any time in a window of the clock (``WINDOW_S`` long, moved
when the clock leaves it): a plan reads only the nodes indexed at or above what it
needs, and bounds those exactly. A node's entry moves as its jobs change; contracts
that end within the window are counted from its start, so time passing inside the
window changes nothing there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from libs.core.contract import RunningJob
from libs.core.ids import NodeId

# (protected until, GPUs on the node, loses nothing until, likely end)
Room = tuple[float, int, float, float]
# The window the index covers: long enough that few contracts end inside it (a node's
# bound may then only be lower than its entry), short enough that moving it is rare.
WINDOW_S = 300.0


def room_of(victims: Iterable[RunningJob]) -> tuple[Room, ...]:
    """A node's preemptible jobs as ``bound`` reads them: each loses nothing when stopped
    until its ``lossless_until`` (work that has not started, or resumes, for ever; work
    that resumes from the checkpoints it reports, until its last; other work, its start)."""
    return tuple(
        sorted(
            (
                v.protected_until,
                v.gpus,
                v.lossless_until,
                v.likely_end,
            )
            for v in victims
        )
    )


def bound(rooms: tuple[Room, ...], now: float, *, lossless: bool, free_work: bool = False) -> int:
    """At most the GPUs a plan at ``now`` may free by stopping the jobs of ``rooms``: those
    no longer protected (and, ``lossless``, that lose nothing yet; ``free_work``, that are
    not charged: never protected, they come first)."""
    room = 0
    for protected_until, gpus, lossless_until, _ in rooms:
        if protected_until > (-math.inf if free_work else now):
            break  # sorted: the rest are protected longer
        if not lossless or now <= lossless_until:
            room += gpus
    return room


_NONE = (0, 0, 0, 0)


class RoomIndex:
    """Nodes by the most GPUs ``bound`` may give there at any time in ``window``,
    losslessly and not, of all work and of free work only (see the module)."""

    def __init__(self) -> None:
        self.window = (math.inf, -math.inf)  # [start, end] of the clock covered: none yet
        # node -> the most, as ``_family`` orders them (a node with none is left out)
        self.most: dict[NodeId, tuple[int, int, int, int]] = {}
        # per family: the most -> the nodes with it
        self.nodes: tuple[dict[int, dict[NodeId, None]], ...] = ({}, {}, {}, {})

    def at_least(self, gpus: int, *, lossless: bool, free_work: bool = False) -> list[NodeId]:
        """The nodes whose bound may reach ``gpus`` at some time in the window: every node
        where it does (and some where it does not)."""
        return [
            node_id
            for most, nodes in self.nodes[_family(lossless, free_work)].items()
            if most >= gpus
            for node_id in nodes
        ]

    def covers(self, now: float) -> bool:
        return self.window[0] <= now <= self.window[1]

    def rebuild(self, rooms: Mapping[NodeId, tuple[Room, ...]], now: float) -> None:
        """Cover a window from ``now`` on, with every node's ``rooms``."""
        self.window = (now, now + WINDOW_S)
        self.most = {}
        self.nodes = ({}, {}, {}, {})
        for node_id, node_rooms in rooms.items():
            self.put(node_id, node_rooms)

    def put(self, node_id: NodeId, rooms: tuple[Room, ...]) -> None:
        """The node's preemptible jobs are now ``rooms`` (empty: none)."""
        start, end = self.window
        if start > end:
            return  # nothing asked yet: the first question builds it all
        lossless = lossy = free_lossless = free_lossy = 0
        for protected_until, gpus, lossless_until, _ in rooms:
            if protected_until > end:
                break
            lossy += gpus
            if lossless_until >= start:
                lossless += gpus
            if protected_until == -math.inf:  # free work
                free_lossy += gpus
                if lossless_until >= start:
                    free_lossless += gpus
        new = (lossless, lossy, free_lossless, free_lossy)
        old = self.most.get(node_id, _NONE)
        if new == old:
            return
        for nodes, was, now in zip(self.nodes, old, new, strict=True):
            if was != now:
                if was:
                    del nodes[was][node_id]
                    if not nodes[was]:
                        del nodes[was]
                if now:
                    nodes.setdefault(now, {})[node_id] = None
        if new == _NONE:
            del self.most[node_id]
        else:
            self.most[node_id] = new


def _family(lossless: bool, free_work: bool) -> int:
    return (0 if lossless else 1) + (2 if free_work else 0)
