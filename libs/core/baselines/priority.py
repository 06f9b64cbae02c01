"""The old style: strict priority levels, per-team GPU caps, preemptible backfill.

``JobSpec.priority`` maps to four levels (<= -1 LOW, 0 NORMAL, 1 HIGH,
>= 2 URGENT). Waiting work is considered highest level first, then by
submission; whatever fits starts, so smaller or lower jobs backfill around a
big one that waits. A job starts *guaranteed* (never preempted) while its
team's guaranteed GPUs stay within the team's cap, its entitlement in the
budget tree times the cluster's GPUs, rounded down; beyond the cap it starts
as *backfill*. A waiting job that does not fit may stop backfill of strictly
lower levels on one node (lowest level, then newest, first). Gangs spanning
nodes neither preempt nor are preempted. There is no contract and no
usage history: minimum runtimes are ignored, which is the point of comparing.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass

from libs.core.baselines._baseline import BaselinePolicy, Running
from libs.core.budget_tree import BudgetTree
from libs.core.decisions import Decision, StopCause
from libs.core.ids import JobId, NodeId
from libs.core.model import JobSpec
from libs.core.wait_reasons import WaitCode, WaitReason

POLICY = "priority"


class Level(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    URGENT = 3


def level_of(priority: int) -> Level:
    return Level(min(max(priority + 1, Level.LOW), Level.URGENT))


@dataclass(frozen=True)
class _Waiting:
    spec: JobSpec
    key: tuple[int, int]  # (-level, submission order): smallest first


class PriorityPolicy(BaselinePolicy):
    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[JobId, _Waiting] = {}
        self._levels: dict[JobId, int] = {}  # job -> level, for every job seen
        # One heap per (GPU count, GPU type): only its head can be the next to start,
        # so a pass looks at a handful of heads, not the whole queue.
        self._heaps: dict[tuple[int, str], list[tuple[int, int, JobId]]] = {}
        self._shares: dict[str, float] = {}
        self._caps: dict[str, int] = {}
        self._guaranteed: dict[str, int] = {}  # team -> GPUs held by guaranteed work
        self._victims_for: dict[JobId, tuple[JobId, ...]] = {}  # waiting job -> jobs it stops
        # Single-node backfill that is not stopping yet: the only possible victims.
        self._backfill: dict[NodeId, dict[JobId, Running]] = {}  # node -> job -> job
        self._backfill_gpus: dict[NodeId, list[int]] = {}  # node -> GPUs per level
        self._backfill_jobs = [0] * len(Level)  # per level, for a quick "any victim at all?"

    def _enqueue(self, job_id: JobId, spec: JobSpec) -> None:
        level = self._levels.setdefault(job_id, level_of(spec.priority))
        key = (-level, self._seq[job_id])
        self._waiting[job_id] = _Waiting(spec, key)
        heapq.heappush(self._heaps.setdefault((spec.gpus, spec.gpu_type), []), (*key, job_id))

    def _dequeue(self, job_id: JobId) -> JobSpec | None:
        waiting = self._waiting.pop(job_id, None)  # its heap entry is dropped lazily
        self._victims_for.pop(job_id, None)
        return waiting.spec if waiting else None

    def _is_waiting(self, job_id: JobId) -> bool:
        return job_id in self._waiting

    def _reason(self, job_id: JobId) -> WaitReason:
        spec = self._waiting[job_id].spec
        level = Level(self._levels[job_id]).name
        return WaitReason.of(WaitCode.BEHIND_PRIORITY, level=level, gpus=spec.gpus)

    def _budget(self, tree: BudgetTree) -> None:
        self._shares = tree.entitlements()
        self._capacity_changed()

    def _capacity_changed(self) -> None:
        capacity = self.inventory.capacity
        self._caps = {team: int(share * capacity) for team, share in self._shares.items()}

    def _started(self, job: Running) -> None:
        self._victims_for.pop(job.job_id, None)
        team = job.spec.allocation
        held = self._guaranteed.get(team, 0)
        if held + job.spec.gpus <= self._caps.get(team, 0):
            self._guaranteed[team] = held + job.spec.gpus
            return
        job.preemptible = True
        if len(job.tasks) == 1:
            self._index(job, add=True)

    def _ended(self, job: Running) -> None:
        if not job.preemptible:
            self._guaranteed[job.spec.allocation] -= job.spec.gpus
        elif job.job_id in self._backfill.get(job.node_id, {}):
            self._index(job, add=False)

    def _stop(self, job: Running, cause: StopCause, reason: str) -> list[Decision]:
        if job.stopping is None and job.job_id in self._backfill.get(job.node_id, {}):
            self._index(job, add=False)
        return super()._stop(job, cause, reason)

    def _index(self, job: Running, *, add: bool) -> None:
        level = self._levels[job.job_id]
        node_id = job.node_id
        jobs = self._backfill.setdefault(node_id, {})
        gpus = self._backfill_gpus.setdefault(node_id, [0] * len(Level))
        if add:
            jobs[job.job_id] = job
        else:
            del jobs[job.job_id]
        sign = 1 if add else -1
        gpus[level] += sign * job.spec.gpus
        self._backfill_jobs[level] += sign

    def _schedule(self) -> list[Decision]:
        decisions: list[Decision] = []
        placed = True
        while placed:
            placed = False
            for job_id in self._heads():
                spec = self._waiting[job_id].spec
                placement = self.inventory.fit(spec.gpus, spec.gpu_type)
                if placement is not None:
                    self._pop(job_id)
                    decisions += self._start(job_id, spec, placement)
                    placed = True
                    break
        if any(self._backfill_jobs):
            decisions += self._preempt()
        return decisions

    def _heads(self) -> list[JobId]:
        """The first waiting job of each size, highest level and earliest first."""
        heads: list[tuple[int, int, JobId]] = []
        for heap in self._heaps.values():
            while heap and heap[0][2] not in self._waiting:
                heapq.heappop(heap)
            if heap:
                heads.append(heap[0])
        return [job_id for *_, job_id in sorted(heads)]

    def _pop(self, job_id: JobId) -> None:
        spec = self._waiting.pop(job_id).spec
        heapq.heappop(self._heaps[(spec.gpus, spec.gpu_type)])

    def _preempt(self) -> list[Decision]:
        decisions: list[Decision] = []
        failed: list[tuple[int, int]] = []  # (level, GPUs) that found no room this pass
        for job_id in self._heads():
            spec = self._waiting[job_id].spec
            level = self._levels[job_id]
            if not any(self._backfill_jobs[:level]):
                continue
            if any(v in self.running for v in self._victims_for.get(job_id, ())):
                continue  # already making room; wait for those tasks to end
            if any(lv >= level and gpus <= spec.gpus for lv, gpus in failed):
                continue  # a higher or equal job needing no more found no room
            victims = self._victims(spec, level)
            if not victims:
                failed.append((level, spec.gpus))
                continue
            self._victims_for[job_id] = tuple(v.job_id for v in victims)
            reason = f"preempted by {job_id} ({Level(level).name})"
            for victim in victims:
                decisions += self._stop(victim, StopCause.PREEMPTED, reason)
        return decisions

    def _victims(self, spec: JobSpec, level: int) -> list[Running]:
        """Backfill of lower levels on the node with the most free GPUs among those
        where stopping it makes room; lowest level first, then the newest."""
        best: tuple[int, NodeId] | None = None
        for node_id, below in self._backfill_gpus.items():
            if self.inventory.size(node_id) < spec.gpus:
                continue
            if spec.gpu_type and self.inventory.gpu_type(node_id) != spec.gpu_type:
                continue
            free = self.inventory.free(node_id)
            if free + sum(below[:level]) < spec.gpus:
                continue
            if best is None or (-free, node_id) < (-best[0], best[1]):
                best = (free, node_id)
        if best is None:
            return []
        room, node_id = best
        candidates = sorted(
            (j for j in self._backfill[node_id].values() if self._levels[j.job_id] < level),
            key=lambda j: (self._levels[j.job_id], -j.seq),
        )
        chosen: list[Running] = []
        for victim in candidates:
            if room >= spec.gpus:
                break
            chosen.append(victim)
            room += victim.spec.gpus
        return chosen
