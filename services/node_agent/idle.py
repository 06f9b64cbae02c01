"""Idle/busy detection of running tasks, from utilisation samples; pure, no clock of its own.

A task goes idle once the mean utilisation of its GPUs over a full window falls below
``idle_below``, and busy again once that mean rises above ``busy_above``. The gap between
the two keeps a task hovering around one threshold from flapping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import fmean


@dataclass(frozen=True)
class IdleThresholds:
    """Utilisations are fractions 0..1; ``idle_below`` 0 turns idle detection off."""

    idle_below: float = 0.05
    busy_above: float = 0.15
    window_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.idle_below <= self.busy_above <= 1:
            raise ValueError(
                "need 0 <= idle threshold <= busy threshold <= 1, got "
                f"{self.idle_below} and {self.busy_above}"
            )
        if self.window_s <= 0:
            raise ValueError(f"the idle window must be > 0 seconds, got {self.window_s}")


@dataclass(frozen=True)
class Transition:
    task_id: str
    idle: bool
    utilization: float  # mean over the window that decided it


@dataclass
class _Task:
    since: float
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    idle: bool = False


def task_utilization(by_gpu: Mapping[int, float], gpu_indices: Iterable[int]) -> float:
    """The mean utilisation of a task's GPUs in one sample."""
    return fmean(by_gpu[index] for index in gpu_indices)


class IdleDetector:
    """The idle/busy state of the tasks running on one node."""

    def __init__(self, thresholds: IdleThresholds) -> None:
        self._thresholds = thresholds
        self._tasks: dict[str, _Task] = {}

    def observe(self, at: float, utilization: Mapping[str, float]) -> list[Transition]:
        """Add a sample taken at ``at`` (seconds) for each running task; return the changes.

        ``utilization`` maps every running task to its mean GPU utilisation now. Tasks
        missing from it have ended and are forgotten; new ones start busy, without a change.
        """
        for task_id in self._tasks.keys() - utilization.keys():
            del self._tasks[task_id]
        window_s = self._thresholds.window_s
        changes = []
        for task_id, level in utilization.items():
            task = self._tasks.get(task_id)
            if task is None:
                task = self._tasks[task_id] = _Task(since=at)
            task.samples.append((at, level))
            while task.samples[0][0] <= at - window_s:
                task.samples.popleft()
            if at - task.since < window_s:
                continue  # judging a task on part of a window would flag every slow start
            mean = fmean(sample for _, sample in task.samples)
            if task.idle:
                crossed = mean > self._thresholds.busy_above
            else:
                crossed = mean < self._thresholds.idle_below
            if crossed:
                task.idle = not task.idle
                changes.append(Transition(task_id, task.idle, mean))
        return changes
