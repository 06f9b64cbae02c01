"""Serving's load, and the workflows it keeps waiting under overload.

When workflows bring more work than the GPUs can run, someone must wait, and
compass makes it the workflows with the most work: holding one back frees the
most GPU time for the least slowdown (its wait over its long best case).
``Load`` remembers the work (GPU run time) of each workflow that arrived here
and of what was admitted (this planner's workflows when planned, other
planners' tasks as it reads their sends), with the GPU type each asked for or
ran on. A workflow waits (``sheds``) while, on the GPUs of its type,

- it and the workflows that arrived no larger than it bring more work than
  ``admit_load`` × those GPUs can run (it is among the largest that do not
  fit), counted over ``arrival_window_s``: long enough to tell overload from a
  few arrivals close together; or
- admitting it would take the work admitted over ``admit_window_s`` past that:
  when the load dips, the workflows held back go in at the rate the GPUs serve
  them, not all at once.

A workflow waits only for others' work: one too large to fit alone goes when
nothing else is counted. Work counts over twice a window, the older the less (a
triangle, as much in all as one window counted whole), so an arrival leaving
the window moves the answer a little, not all at once. The sums run over the
entries in the order the inputs wrote them, with no rounding that depends on
the machine, so a replay gets the same answer.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from libs.core.state import State, Table


class Work(NamedTuple):
    at_ms: float
    gpu_type: str  # "" for any
    work_ms: float


class Load:
    """The work that arrived and was admitted lately, each counted over its window."""

    def __init__(self, state: State, arrival_window_ms: float, admit_window_ms: float) -> None:
        self.arrival_window_ms = arrival_window_ms
        self.admit_window_ms = admit_window_ms
        self._arrived: Table[str, Work] = state.table("serving.arrived")
        # Under a job id (this planner's workflow) or a task id (a peer's task).
        self._admitted: Table[str, Work] = state.table("serving.admitted")

    def arrive(self, job_id: str, work: Work) -> None:
        _expire(self._arrived, work.at_ms, self.arrival_window_ms)
        self._arrived[job_id] = work

    def admit(self, key: str, work: Work) -> None:
        _expire(self._admitted, work.at_ms, self.admit_window_ms)
        self._admitted[key] = work

    def sheds(self, job_id: str, work: Work, gpus: float) -> bool:
        """Whether the workflow (``work``, as it is now) waits, ``gpus`` being what the
        GPUs of its type may run at once. A read: entries past their window are left
        for the next write to drop."""
        admitted = _weighed(self._admitted, job_id, work, self.admit_window_ms, math.inf)
        if admitted and admitted + work.work_ms > gpus * self.admit_window_ms:
            return True
        arrived = _weighed(self._arrived, job_id, work, self.arrival_window_ms, work.work_ms)
        return bool(arrived) and arrived + work.work_ms > gpus * self.arrival_window_ms


def _weighed(
    entries: Table[str, Work], job_id: str, work: Work, window_ms: float, most_ms: float
) -> float:
    """The work of the others' entries no larger than ``most_ms`` on ``work``'s GPU
    type, each weighed by its age: 1 new, 0 two windows old."""
    width = 2 * window_ms
    now_ms = work.at_ms
    return sum(
        w.work_ms * (1 - (now_ms - w.at_ms) / width)
        for key, w in entries.items()
        if key != job_id
        and now_ms - w.at_ms < width
        and w.work_ms <= most_ms
        and (not work.gpu_type or w.gpu_type == work.gpu_type)
    )


def _expire(entries: Table[str, Work], now_ms: float, window_ms: float) -> None:
    while entries and now_ms - entries.first()[1].at_ms >= 2 * window_ms:
        del entries[entries.first()[0]]
