"""How many GPUs serving kept busy lately: the load the pool is sized for.

``BusyMeter`` is told the pool's busy count whenever it changes (the count holds
until the next change) and keeps the running integral of the count over time. It
keeps the last change of each second (a mark) for a window back, so that the
integral is known exactly at any moment not inside a second with changes: the mean
over a window is the integral's growth from its start (moved back to the start of
its second, when changes fall in the same second) to now, over the time between.
A meter younger than its window averages over its life.

The count jumps with every task that starts and drains; its mean over tens of
seconds moves with the traffic. Only a change is a write, so an input that changes
nothing leaves the state as it was. Additions, multiplications and one division, no
rounding that depends on the machine: a replay gets the same mean.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from libs.core.state import Cell, State, Table

MARK_MS = 1000.0  # one mark a second: a window may start up to this much early


class Reading(NamedTuple):
    """A change: when, the busy GPU-ms integral up to it, and the count from it on."""

    at_ms: float
    integral: float
    busy: int

    def integral_at(self, at_ms: float) -> float:
        """The integral at a moment from this change to the next."""
        return self.integral + self.busy * (at_ms - self.at_ms)


class BusyMeter:
    """The time-weighted mean of the busy count over ``window_ms``."""

    def __init__(self, state: State, window_ms: float) -> None:
        self.window_ms = window_ms
        self._last: Cell[Reading] = state.cell("serving.busy", Reading(0.0, 0.0, 0))
        # second -> the last change in it, in time order, back to the one in effect a
        # window before the last change.
        self._marks: Table[int, Reading] = state.table("serving.busy_marks")

    def count(self, now_ms: float, busy: int) -> None:
        """Serving has ``busy`` GPUs busy from ``now_ms`` on (the log's clock only
        moves on: an earlier time counts as the last change's)."""
        last = self._last.value
        if busy == last.busy:
            return
        at_ms = max(now_ms, last.at_ms)
        reading = Reading(at_ms, last.integral_at(at_ms), busy)
        self._last.value = reading
        self._marks[int(at_ms // MARK_MS)] = reading
        # The oldest mark goes once the next one is in effect a whole window back.
        while len(self._marks) > 1:
            (oldest, _), (_, following) = itertools.islice(self._marks.items(), 2)
            if following.at_ms > at_ms - self.window_ms:
                break
            del self._marks[oldest]

    def mean(self, now_ms: float) -> float:
        """The mean busy count over the window that ends at ``now_ms``."""
        last = self._last.value
        now_ms = max(now_ms, last.at_ms)
        start_ms = now_ms - self.window_ms
        if last.at_ms <= start_ms:
            return float(last.busy)  # no change in the window
        before: Reading | None = None  # the last change at or before the window's start
        for second, mark in self._marks.items():
            if mark.at_ms > start_ms:
                # Changes in this mark's second before the window's start are not kept:
                # start at the second's start, up to a mark early. With no mark before
                # it none was dropped: a meter younger than its window averages over its
                # life, from its first second (the count was 0 before).
                first = second * MARK_MS
                start_ms = first if before is None else min(start_ms, first)
                break
            before = mark
        if now_ms - start_ms < MARK_MS:
            return float(last.busy)  # younger than a mark: the count itself
        start = 0.0 if before is None else before.integral_at(start_ms)
        return (last.integral_at(now_ms) - start) / (now_ms - start_ms)
