"""Waiting work, by tier, allocation and size, each list in queue order.

Splitting an allocation's queue by GPU count lets a scheduling pass jump to
the first job that can fit the largest free block instead of walking past
every job that cannot: a pass costs what it places, not the queue's length.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from libs.core.ids import JobId
from libs.core.model import JobSpec, WorkClass
from libs.core.state import State, Table

TIERS = (WorkClass.DEBUG, WorkClass.ALLOCATED, WorkClass.UNALLOCATED)


@dataclass(frozen=True)
class Waiting:
    job_id: JobId
    spec: JobSpec
    seq: int  # submission order; kept across requeues
    attempt: int  # 0 for the first placement; +1 per requeue
    since: float

    @property
    def key(self) -> tuple[int, int, JobId]:
        return (-self.spec.priority, self.seq, self.job_id)

    def fact(self) -> str:
        """Every field, for the state digest (the job id is the table's key)."""
        return f"{self.seq}|{self.attempt}|{self.since}|{self.spec.fact}"


class Queues:
    DERIVED = ("_lists",)

    def __init__(self, state: State | None = None) -> None:
        self.jobs: Table[JobId, Waiting] = (state or State()).table("queues.jobs", Waiting.fact)
        # An index over ``jobs`` (``derived`` rebuilds it):
        # tier -> allocation -> GPUs on one node (``JobSpec.block``) -> sorted keys
        self._lists: dict[WorkClass, dict[str, dict[int, list[tuple[int, int, JobId]]]]] = {
            tier: {} for tier in TIERS
        }
        # A memo, not state: tier -> allocation -> its first job's key, for those asked
        # since their queue changed (every pass asks for every allocation's head).
        self._heads: dict[WorkClass, dict[str, tuple[int, int, JobId]]] = {
            tier: {} for tier in TIERS
        }
        # A memo, not state: tier -> the allocations whose first job may have changed
        # since the scheduler last ``settle``d them (every pass asks whether each head
        # has heard why it waits; most have, and have not changed since).
        self._moved: dict[WorkClass, set[str]] = {tier: set() for tier in TIERS}

    def __len__(self) -> int:
        return len(self.jobs)

    def push(self, job: Waiting) -> None:
        self.jobs[job.job_id] = job
        sizes = self._lists[job.spec.work_class].setdefault(job.spec.allocation, {})
        bisect.insort(sizes.setdefault(job.spec.block, []), job.key)
        self._moved_head(job)

    def derived(self) -> dict[WorkClass, dict[str, dict[int, list[tuple[int, int, JobId]]]]]:
        """The index rebuilt from ``jobs`` alone (tests compare it with the one kept)."""
        lists: dict[WorkClass, dict[str, dict[int, list[tuple[int, int, JobId]]]]] = {
            tier: {} for tier in TIERS
        }
        for job in self.jobs.values():
            sizes = lists[job.spec.work_class].setdefault(job.spec.allocation, {})
            sizes.setdefault(job.spec.block, []).append(job.key)
        for allocations in lists.values():
            for sizes in allocations.values():
                for keys in sizes.values():
                    keys.sort()
        return lists

    @property
    def index(self) -> dict[WorkClass, dict[str, dict[int, list[tuple[int, int, JobId]]]]]:
        return self._lists

    def remove(self, job_id: JobId) -> Waiting | None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        allocations = self._lists[job.spec.work_class]
        sizes = allocations[job.spec.allocation]
        self._moved_head(job)
        keys = sizes[job.spec.block]
        del keys[bisect.bisect_left(keys, job.key)]
        if not keys:
            del sizes[job.spec.block]
            if not sizes:
                del allocations[job.spec.allocation]
        return job

    def _moved_head(self, job: Waiting) -> None:
        """``job`` joined or left its allocation's queue: its first job may differ."""
        self._heads[job.spec.work_class].pop(job.spec.allocation, None)
        self._moved[job.spec.work_class].add(job.spec.allocation)

    def moved(self, tier: WorkClass) -> set[str]:
        """The tier's allocations whose first job may have changed since ``settle``."""
        return self._moved[tier]

    def settle(self, tier: WorkClass, allocation: str) -> None:
        self._moved[tier].discard(allocation)

    def allocations(self, tier: WorkClass) -> list[str]:
        return list(self._lists[tier])

    def candidates(
        self,
        tier: WorkClass,
        allocation: str,
        size_ok: Callable[[int], bool],
        after: tuple[int, int, JobId] | None = None,
    ) -> Iterator[Waiting]:
        """Jobs of one allocation whose GPUs on one node (``JobSpec.block``) pass
        ``size_ok``, in queue order, after the job whose key is ``after``. Each size is
        asked once, as the walk starts, and the queue must not change during it: a
        caller that places a job (so that other sizes may fit, or no longer) walks
        again after it. A walk costs the log of the sizes per job, not the sizes."""
        sizes = self._lists[tier].get(allocation)
        if not sizes:
            return
        # Each size's keys from the first after ``after`` (a lazy view, not a copy).
        runs = [
            map(
                keys.__getitem__, range(bisect.bisect_right(keys, after) if after else 0, len(keys))
            )
            for gpus, keys in sizes.items()
            if size_ok(gpus)
        ]
        jobs = self.jobs
        for key in runs[0] if len(runs) == 1 else heapq.merge(*runs):
            yield jobs[key[2]]

    def in_order(self, tier: WorkClass, allocation: str, limit: int) -> list[Waiting]:
        """The first ``limit`` jobs of one allocation, in queue order."""
        sizes = self._lists[tier].get(allocation, {})
        keys = itertools.islice(heapq.merge(*sizes.values()), limit)
        return [self.jobs[key[2]] for key in keys]

    def head(self, tier: WorkClass, allocation: str) -> Waiting | None:
        heads = self._heads[tier]
        key = heads.get(allocation)
        if key is None:
            sizes = self._lists[tier].get(allocation)
            if not sizes:
                return None
            key = heads[allocation] = min(keys[0] for keys in sizes.values())
        return self.jobs[key[2]]

    def ahead_of(self, job: Waiting, rank: dict[str, int]) -> int:
        """How many waiting jobs go before ``job`` in the current order."""
        tier = job.spec.work_class
        mine = (rank.get(job.spec.allocation, len(rank)), job.spec.allocation)
        count = 0
        for other_tier in TIERS:
            for allocation, sizes in self._lists[other_tier].items():
                keys = [k for ks in sizes.values() for k in ks]
                if TIERS.index(other_tier) < TIERS.index(tier):
                    count += len(keys)
                elif other_tier == tier:
                    theirs = (rank.get(allocation, len(rank)), allocation)
                    if theirs < mine:
                        count += len(keys)
                    elif allocation == job.spec.allocation:
                        count += sum(1 for k in keys if k < job.key)
        return count
