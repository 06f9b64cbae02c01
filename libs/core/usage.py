"""GPU-seconds charged per allocation, folded from task lifecycle facts.

Charges are a pure function of the log, so a restarted budget service that
refolds the log charges every task exactly once. Unallocated work (minimum
runtime 0) is recorded apart and is free.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Usage:
    allocated_gpu_s: float = 0.0
    unallocated_gpu_s: float = 0.0


@dataclass
class UsageLedger:
    _jobs: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    _started: dict[str, tuple[str, float]] = field(default_factory=dict)
    _usage: dict[str, Usage] = field(default_factory=dict)

    def job(self, job_id: str, allocation: str, gpus: int, *, allocated: bool) -> None:
        self._jobs.setdefault(job_id, (allocation, gpus, allocated))

    def started(self, job_id: str, task_id: str, at: float) -> None:
        self._started.setdefault(task_id, (job_id, at))

    def ended(self, task_id: str, at: float) -> None:
        """Charge a task once, on its first end; later duplicates change nothing."""
        start = self._started.pop(task_id, None)
        if start is None:
            return
        job_id, started_at = start
        if job_id not in self._jobs:
            return
        allocation, gpus, allocated = self._jobs[job_id]
        gpu_s = gpus * max(0.0, at - started_at)
        before = self._usage.get(allocation, Usage())
        self._usage[allocation] = (
            Usage(before.allocated_gpu_s + gpu_s, before.unallocated_gpu_s)
            if allocated
            else Usage(before.allocated_gpu_s, before.unallocated_gpu_s + gpu_s)
        )

    def usage(self, allocation: str) -> Usage:
        return self._usage.get(allocation, Usage())
