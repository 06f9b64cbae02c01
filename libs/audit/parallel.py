"""The audit over several processes: the input partitions split among workers.

Each input partition is an independent stream (its own schedulers, its own
clusters; its decisions name it in their provenance), so a worker per group of
partitions reads Kafka itself and replays only its own (``audit_topics``'s
``partitions``); the verdicts are merged. Workers are spawned: a fork would copy
the parent's event loop and Kafka clients.

A worker that finds a divergence stops; the others replay their partitions to the
end, so with a divergence ``checked`` may count more than a serial audit's. The
divergence reported is the first by (partition, input offset, index) of those found.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from libs.audit.kafka_source import ProgressSink, audit_topics, input_partitions
from libs.audit.replay import AuditResult
from libs.bus import KafkaSettings, Topics
from libs.core import PolicyConfig

# A worker's progress, sent to the parent: (worker, task, "total" | "completed", value).
_Update = tuple[int, str, str, float]
_updates: multiprocessing.Queue[_Update] | None = None  # in a worker: where it reports


def default_workers(partitions: int) -> int:
    """A worker per core, no more than there are partitions."""
    return max(1, min(len(os.sched_getaffinity(0)), partitions))


def audit_parallel(
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig | None = None,
    *,
    group: str | None = None,
    clusters: Collection[str] = (),
    progress: ProgressSink | None = None,
    from_snapshots: bool = False,
    workers: int | None = None,
    trust: Path | None = None,
) -> AuditResult:
    """``audit_topics`` with the input partitions split among ``workers`` processes
    (``default_workers`` when None; one: in this process)."""
    partitions = asyncio.run(input_partitions(settings, topics, clusters))
    count = min(workers or default_workers(len(partitions)), max(1, len(partitions)))
    options: dict[str, Any] = {
        "group": group,
        "clusters": clusters,
        "from_snapshots": from_snapshots,
        "trust": trust,  # a path: each worker reads the keys and checks its own inputs
    }
    if count == 1:
        return asyncio.run(audit_topics(settings, topics, config, progress=progress, **options))
    groups = [partitions[i::count] for i in range(count)]
    context = multiprocessing.get_context("spawn")
    updates: multiprocessing.Queue[_Update] = context.Queue()
    with ProcessPoolExecutor(
        count, mp_context=context, initializer=_start_worker, initargs=(updates,)
    ) as pool:
        futures = [
            pool.submit(_audit_group, index, settings, topics, config, chosen, options)
            for index, chosen in enumerate(groups)
        ]
        _relay(futures, updates, progress)
        return merge([f.result() for f in futures])


def merge(results: Sequence[AuditResult]) -> AuditResult:
    """The verdicts of disjoint groups of input partitions as one."""
    found = [r.divergence for r in results if r.divergence is not None]
    return AuditResult(
        inputs=sum(r.inputs for r in results),
        checked=sum(r.checked for r in results),
        reproduced=sum(r.reproduced for r in results),
        divergence=min(found, key=lambda d: (d.partition, d.input_offset, d.index), default=None),
        config=next((r.config for r in results if r.config), ()),
        snapshots=tuple(
            sorted((s for r in results for s in r.snapshots), key=lambda s: s.partition)
        ),
        started_from=tuple(sorted(p for r in results for p in r.started_from)),
        others=tuple(sorted((o for r in results for o in r.others), key=lambda o: o.partition)),
    )


def _start_worker(updates: multiprocessing.Queue[_Update]) -> None:
    global _updates
    _updates = updates


def _audit_group(
    index: int,
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig | None,
    partitions: list[int],
    options: dict[str, Any],
) -> AuditResult:
    sink = None if _updates is None else _Relay(index, _updates)
    return asyncio.run(
        audit_topics(settings, topics, config, partitions=partitions, progress=sink, **options)
    )


class _Relay:
    """A worker's ``ProgressSink``: its tasks' totals and progress, sent to the parent."""

    def __init__(self, worker: int, updates: multiprocessing.Queue[_Update]) -> None:
        self._worker = worker
        self._updates = updates

    def add_task(self, description: str, *, total: float | None) -> str:
        self._updates.put((self._worker, description, "total", total or 0))
        return description

    def update(self, task_id: Any, *, completed: float, total: float | None = None) -> None:
        self._updates.put((self._worker, str(task_id), "completed", completed))


def _relay(
    futures: list[Future[AuditResult]],
    updates: multiprocessing.Queue[_Update],
    progress: ProgressSink | None,
) -> None:
    """Until the workers are done: their progress summed into ``progress``'s tasks."""
    sums: dict[str, dict[str, dict[int, float]]] = {}  # task -> total|completed -> worker
    tasks: dict[str, Any] = {}
    while True:
        done = not wait(futures, timeout=0).not_done
        try:
            while True:
                worker, name, kind, value = updates.get(timeout=0 if done else 0.2)
                sums.setdefault(name, {"total": {}, "completed": {}})[kind][worker] = value
        except queue.Empty:
            pass
        if progress is not None:
            for name, values in sums.items():
                total = sum(values["total"].values())
                if name not in tasks:
                    tasks[name] = progress.add_task(name, total=total)
                completed = sum(values["completed"].values())
                progress.update(tasks[name], completed=completed, total=total)
        if done:
            return
