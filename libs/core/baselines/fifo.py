"""FIFO: strict arrival order, first fit, no preemption, no backfill.

A job starts only once every job submitted before it has started, so one big
job at the head holds back everything behind it: the textbook baseline that
shows what head-of-line blocking costs. (EASY and the priority baseline
backfill.) A job larger than all registered nodes together is set aside
rather than freezing the queue for good.
"""

from __future__ import annotations

from collections import deque

from libs.core.baselines._baseline import BaselinePolicy
from libs.core.decisions import Decision
from libs.core.ids import JobId
from libs.core.model import JobSpec
from libs.core.wait_reasons import WaitCode, WaitReason

POLICY = "fifo"


class FifoPolicy(BaselinePolicy):
    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[JobId] = deque()  # arrival order; cancelled ids are skipped lazily
        self._waiting: dict[JobId, JobSpec] = {}

    def _enqueue(self, job_id: JobId, spec: JobSpec) -> None:
        self._waiting[job_id] = spec
        self._queue.append(job_id)

    def _dequeue(self, job_id: JobId) -> JobSpec | None:
        return self._waiting.pop(job_id, None)

    def _is_waiting(self, job_id: JobId) -> bool:
        return job_id in self._waiting

    def _reason(self, job_id: JobId) -> WaitReason:
        spec = self._waiting[job_id]
        if not self.inventory.could_ever_fit(spec.gpus, spec.gpu_type):
            return WaitReason.of(WaitCode.NEVER_FITS, gpus=spec.gpus)
        if self._head() == job_id:
            return WaitReason.of(WaitCode.FIRST_IN_LINE, gpus=spec.gpus)
        return WaitReason.of(WaitCode.IN_LINE, ahead=len(self._queue) - 1)

    def _schedule(self) -> list[Decision]:
        decisions: list[Decision] = []
        while (head := self._head()) is not None:
            spec = self._waiting[head]
            placement = self.inventory.fit(spec.gpus, spec.gpu_type)
            if placement is None:
                if self.inventory.could_ever_fit(spec.gpus, spec.gpu_type):
                    break
                # It waits for a bigger cluster, off the line, so it blocks no one.
                self._queue.popleft()
                continue
            self._queue.popleft()
            del self._waiting[head]
            decisions += self._start(head, spec, placement)
        return decisions

    def _capacity_changed(self) -> None:
        # Jobs set aside as too big may fit now: rebuild the line in arrival order.
        self._queue = deque(sorted(self._waiting, key=self._seq.__getitem__))

    def _head(self) -> JobId | None:
        while self._queue and self._queue[0] not in self._waiting:
            self._queue.popleft()
        return self._queue[0] if self._queue else None
