"""Serving's load, and the workflows it keeps waiting under overload.

When workflows bring more work than the GPUs can run, someone must wait, and
compass makes it the workflows with the most work: holding one back frees the
most GPU time for the least slowdown (its wait over its long best case).
``Load`` remembers the work (GPU run time) of each workflow that arrived (this
planner's, and those of other planners as it reads them off the log) and of
each it admitted, with the GPU type each asked for. A workflow waits
(``sheds``) while, on the GPUs of its type,

- it and the workflows that arrived no larger than it bring more work than
  ``admit_load`` × those GPUs can run (it is among the largest that do not
  fit), counted over ``arrival_window_s``: long enough to tell overload from a
  few arrivals close together; or
- admitting it would take the work admitted over ``admit_window_s`` past this
  planner's share of what the GPUs run in it: when the load dips, the workflows
  held back go in at the rate the GPUs serve them, not all at once. The share
  is of the GPUs' whole time, not ``admit_load`` of it: that margin is the
  arrivals' test's, and a planner's share is small beside a large workflow.

Among several planners each admits its share, its part of the work that
arrived: they learn of each other's admissions only late, and counting them
would let all of them fill the same dip at once (at 40 GPUs in the paper's
setting, four planners counting each other's sends admitted 1.3 × what the
GPUs run in some two-second spans). One planner's share is all of it.

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
        # Other planners' workflows, as this one reads their arrivals off the log.
        self._peers: Table[str, Work] = state.table("serving.peers_arrived")
        self._admitted: Table[str, Work] = state.table("serving.admitted")

    def arrive(self, job_id: str, work: Work) -> None:
        """A workflow of this planner's arrived (one a peer's word named first is this
        planner's after all)."""
        _expire(self._arrived, work.at_ms, self.arrival_window_ms)
        self._peers.pop(job_id)
        self._arrived[job_id] = work

    def peer_arrived(self, job_id: str, work: Work) -> None:
        """Another planner's workflow arrived there; a second word of it changes nothing
        (the table stays in time order)."""
        _expire(self._peers, work.at_ms, self.arrival_window_ms)
        if job_id not in self._arrived:
            self._peers.setdefault(job_id, work)

    def admit(self, job_id: str, work: Work) -> None:
        _expire(self._admitted, work.at_ms, self.admit_window_ms)
        self._admitted[job_id] = work

    def sheds(self, job_id: str, work: Work, gpus: float, admit_load: float = 1.0) -> bool:
        """Whether the workflow (``work``, as it is now) waits, ``gpus`` being the GPUs
        of its type that may run it and ``admit_load`` the part of them arrivals may
        keep busy. A read: entries past their window are left for the next write to
        drop."""
        admitted = _weighed(self._admitted, job_id, work, self.admit_window_ms, math.inf)
        if admitted:  # the share only when it matters: it reads every arrival
            cap = self._share(job_id, work) * gpus * self.admit_window_ms
            if admitted + work.work_ms > cap:
                return True
        window = self.arrival_window_ms
        arrived = _weighed(self._arrived, job_id, work, window, work.work_ms)
        arrived += _weighed(self._peers, job_id, work, window, work.work_ms)
        return bool(arrived) and arrived + work.work_ms > admit_load * gpus * window

    def _share(self, job_id: str, work: Work) -> float:
        """This planner's part of the others' work that arrived on ``work``'s GPU type,
        weighed as the arrivals' test weighs it; 1 when no peer's counts. The
        workflow's own work is left out: a larger one must not earn a larger share."""
        if not self._peers:
            return 1.0
        window = self.arrival_window_ms
        peers = _weighed(self._peers, job_id, work, window, math.inf)
        if not peers:
            return 1.0
        own = _weighed(self._arrived, job_id, work, window, math.inf)
        return own / (own + peers)


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
