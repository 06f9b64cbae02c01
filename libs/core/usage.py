"""GPU-seconds per allocation over a sliding lookback window.

Charges are a pure function of the task lifecycle, so whoever folds the log
(the projector, the budget service, the simulator) computes the same usage,
and a task is charged once: its end is counted only the first time.

Serving GPUs are charged while held (``hold``, ``release``), busy or idle, to the
allocation they are held for; the tasks that run on them are not charged again.

Finished work is kept in fixed buckets (an hour by default), so the window's
trailing edge moves a bucket at a time; running work is counted exactly.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from libs.core.ids import TaskId


@dataclass(frozen=True)
class Usage:
    allocated_gpu_s: float = 0.0
    unallocated_gpu_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.allocated_gpu_s + other.allocated_gpu_s,
            self.unallocated_gpu_s + other.unallocated_gpu_s,
        )


@dataclass(frozen=True)
class _Running:
    allocation: str
    gpus: int
    allocated: bool
    started_at: float
    price: float  # per GPU-second


class WindowedUsage:
    def __init__(self, window_s: float, bucket_s: float = 3600.0) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._running: dict[TaskId, _Running] = {}
        self._held: dict[Hashable, _Running] = {}  # serving GPUs (node, index) held
        self._ended: set[TaskId] = set()
        # bucket index -> allocation -> usage; totals hold the sum of the kept buckets.
        self._buckets: dict[int, dict[str, Usage]] = {}
        self._indices: list[int] = []  # heap of the kept bucket indices
        self._horizon = -(2**62)  # buckets below this index have left the window
        self._totals: dict[str, Usage] = defaultdict(Usage)

    def __setstate__(self, state: dict[str, object]) -> None:
        # A snapshot taken before serving GPUs were charged while held holds none.
        vars(self).update({"_held": {}, **state})

    def start(
        self,
        task_id: TaskId,
        allocation: str,
        gpus: int,
        *,
        allocated: bool,
        at: float,
        price: float = 1.0,
    ) -> None:
        """Start charging ``gpus`` × ``price`` per second to ``allocation``."""
        if task_id not in self._running and task_id not in self._ended:
            self._running[task_id] = _Running(allocation, gpus, allocated, at, price)

    def end(self, task_id: TaskId, at: float) -> None:
        """Charge a task's whole run; a repeated end changes nothing."""
        run = self._running.pop(task_id, None)
        if run is None:
            return
        self._ended.add(task_id)
        self._close(run, at)

    def hold(self, gpu: Hashable, allocation: str, *, at: float, price: float = 1.0) -> None:
        """Charge a serving GPU to ``allocation`` (as allocated work) from ``at`` until it
        is released or held for another allocation (its charge so far is closed then)."""
        self.release(gpu, at)
        self._held[gpu] = _Running(allocation, 1, True, at, price)

    def release(self, gpu: Hashable, at: float) -> None:
        """Charge a serving GPU's hold up to ``at``; one not held changes nothing."""
        run = self._held.pop(gpu, None)
        if run is not None:
            self._close(run, at)

    def _close(self, run: _Running, at: float) -> None:
        start = run.started_at
        while start < at:
            index = math.floor(start / self.bucket_s)
            stop = min(at, (index + 1) * self.bucket_s)
            self._charge(index, run, (stop - start) * run.gpus)
            start = stop

    def snapshot(self, at: float) -> dict[str, Usage]:
        """Usage per allocation over the window ending at ``at`` (sorted by name)."""
        self._expire(at)
        # Summed as floats, in the order ``Usage.__add__`` would: a snapshot counts every
        # running task, and readers of the log must get the same bits.
        sums = {name: [u.allocated_gpu_s, u.unallocated_gpu_s] for name, u in self._totals.items()}
        since = at - self.window_s
        for run in itertools.chain(self._running.values(), self._held.values()):
            seconds = max(0.0, at - max(run.started_at, since))
            acc = sums.get(run.allocation)
            if acc is None:
                acc = sums[run.allocation] = [0.0, 0.0]
            acc[0 if run.allocated else 1] += _gpu_s(run, seconds)
        return {name: Usage(*acc) for name, acc in sorted(sums.items())}

    def _charge(self, index: int, run: _Running, gpu_s: float) -> None:
        if index < self._horizon:
            return  # already outside the window
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = {}
            heapq.heappush(self._indices, index)
        charge = _usage(run, gpu_s / run.gpus) if run.gpus else Usage()
        bucket[run.allocation] = bucket.get(run.allocation, Usage()) + charge
        self._totals[run.allocation] = self._totals[run.allocation] + charge

    def _expire(self, at: float) -> None:
        self._horizon = max(self._horizon, math.floor((at - self.window_s) / self.bucket_s))
        while self._indices and self._indices[0] < self._horizon:
            for allocation, usage in self._buckets.pop(heapq.heappop(self._indices)).items():
                total = self._totals[allocation]
                self._totals[allocation] = Usage(
                    total.allocated_gpu_s - usage.allocated_gpu_s,
                    total.unallocated_gpu_s - usage.unallocated_gpu_s,
                )


def _gpu_s(run: _Running, seconds: float) -> float:
    return run.gpus * seconds * run.price


def _usage(run: _Running, seconds: float) -> Usage:
    gpu_s = _gpu_s(run, seconds)
    return Usage(allocated_gpu_s=gpu_s) if run.allocated else Usage(unallocated_gpu_s=gpu_s)
