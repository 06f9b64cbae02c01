"""EASY backfilling: FIFO whose head holds a reservation that later jobs start around.

The HPC standard (Lifka 1995; Mu'alem & Feitelson 2001). Jobs wait in arrival
order and start in it while they fit. When the head does not fit, it gets a
reservation at the *shadow time*: the earliest time enough GPUs free up for it,
found by releasing running jobs in the order of their estimated ends. A later
job may start now, in queue order, only if it cannot delay that reservation:
it is estimated to end by the shadow time, or the head still fits at the
shadow time with it running (it uses only GPUs the head will not need).
"Fits" means what it means for FIFO: one node with room, or whole free nodes
for a gang. No preemption.

A job's runtime estimate is the limit its spec requests (``runtime_estimate_s``,
as Slurm's EASY uses the requested wall time). Without one, in the simulator, it is
the job's true runtime (``simulated_duration_s``): an exact estimate, the baseline's
best case, which the report names. A job with neither counts as running forever.
"""

from __future__ import annotations

import math

from libs.core import estimates
from libs.core.baselines._baseline import Running
from libs.core.baselines._inventory import Placement
from libs.core.baselines.fifo import FifoPolicy
from libs.core.decisions import Decision
from libs.core.ids import JobId, NodeId
from libs.core.inputs import Input
from libs.core.model import JobSpec

POLICY = "easy"


def estimate_s(spec: JobSpec) -> float:
    """The core's estimate without learning (the baseline keeps no history), then the
    simulator's true runtime, then forever."""
    return estimates.estimate_s(spec, {}) or spec.simulated_duration_s or math.inf


class EasyPolicy(FifoPolicy):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._ends: dict[JobId, float] = {}  # running job -> its estimated end

    def handle(self, event: Input) -> list[Decision]:
        self._now = event.at
        return super().handle(event)

    def _started(self, job: Running) -> None:
        self._ends[job.job_id] = self._now + estimate_s(job.spec)

    def _ended(self, job: Running) -> None:
        del self._ends[job.job_id]

    def _schedule(self) -> list[Decision]:
        decisions = super()._schedule()  # the head, and those behind it while they fit
        head = self._head()
        if head is None:
            return decisions
        reservation: tuple[float, dict[NodeId, int]] | None = None  # found once needed
        smallest_misfit: dict[str, int] = {}  # GPU type -> fewest GPUs that found no room
        started: list[JobId] = []
        for job_id, spec in self._waiting.items():
            if self.inventory.fit(1, "") is None:
                break  # not one GPU free
            if job_id == head or spec.gpus >= smallest_misfit.get(spec.gpu_type, math.inf):
                continue
            placement = self.inventory.fit(spec.gpus, spec.gpu_type)
            if placement is None:
                smallest_misfit[spec.gpu_type] = spec.gpus
                continue
            reservation = reservation or self._reservation(self._waiting[head])
            if self._delays(reservation, spec, placement, self._waiting[head]):
                continue
            started.append(job_id)
            decisions += self._start(job_id, spec, placement)
        for job_id in started:
            del self._waiting[job_id]
        return decisions

    def _reservation(self, head: JobSpec) -> tuple[float, dict[NodeId, int]]:
        """The shadow time and the free GPUs of the head's nodes then."""
        free = {n: self.inventory.free(n) for n in self.inventory.nodes(head.gpu_type)}
        shadow = math.inf
        for job_id, end in sorted(self._ends.items(), key=lambda item: item[1]):
            if end > shadow:
                break  # every job ending with the shadow time is released
            released = False
            for node_id, gpus in self.running[job_id].tasks.values():
                if node_id in free:
                    free[node_id] += len(gpus)
                    released = True
            if released and shadow == math.inf and self._fits(head, free):
                shadow = max(end, self._now)
        return shadow, free

    def _delays(
        self,
        reservation: tuple[float, dict[NodeId, int]],
        spec: JobSpec,
        placement: Placement,
        head: JobSpec,
    ) -> bool:
        """Whether starting a job now could delay the head; if not, its GPUs that outlast
        the shadow time are taken from the reservation's free GPUs."""
        shadow, free = reservation
        if self._now + estimate_s(spec) <= shadow < math.inf:
            return False
        after = dict(free)
        for node_id, gpus in placement:
            if node_id in after:
                after[node_id] -= len(gpus)
        if not self._fits(head, after):
            return True
        free.update(after)
        return False

    def _fits(self, spec: JobSpec, free: dict[NodeId, int]) -> bool:
        return self.inventory.would_fit(spec.gpus, spec.gpu_type, free)
