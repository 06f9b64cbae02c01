"""One GPU serving workflow tasks: its model cache and its queue. Pure.

The node agent (and the simulator) drive a ``GpuWorker`` per GPU: they
``enqueue`` each dispatched task with when its inputs arrive, call ``start``
whenever the GPU is idle, and ``finish`` when the running task ends. No I/O and
no clock: every time is a float in ms given by the caller.

A task sent with a ``wait_limit_ms`` is refused (``refuses``) when the work ahead
of it here would keep it waiting longer: its planner counted on a shorter queue,
and sends it elsewhere.

Order: one task at a time; ``start`` takes the earliest-enqueued task whose
inputs have arrived. When its model is not resident, the worker makes room as its
``CacheModel`` says: by look-ahead (``evict_for``), models that no queued task and
no planned ``upcoming`` model needs go first, then those needed furthest ahead, for
free; or, with ``fifo-cost``, the models loaded first go first, and each eviction
takes the evicted model's transfer before the load (``cache.miss_ms``). The model
being started is never evicted.

A model larger than the whole GPU does not wedge the queue: the worker evicts
every other model and loads it anyway (``Start.oversized``). The planner refuses
such models for the largest GPU, so this is a placement on a smaller GPU; a real
task then fails in its own load (out of memory) and reports it like any task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from libs.core.compass.cache import evict_for
from libs.core.compass.workflow import CacheModel
from libs.core.ids import TaskId

if TYPE_CHECKING:  # libs.core.decisions imports the compass package (via the model)
    from libs.core.decisions import ServingTask


@dataclass(frozen=True)
class Queued:
    """A dispatched task waiting for the GPU (``ready_ms``: its inputs have arrived)."""

    task_id: TaskId
    serving: ServingTask
    ready_ms: float
    seq: int  # enqueue order


@dataclass(frozen=True)
class Eviction:
    model: str
    size_mb: float
    reason: str  # short, for people: why this model went


@dataclass(frozen=True)
class Start:
    """The task the GPU runs next and what that costs.

    ``start_ms`` is when it begins to run, after the load; ``finish_ms`` is
    ``start_ms + run_ms``. ``loaded`` is False on a cache hit or a task without
    a model, and then ``load_ms`` is 0; with ``fifo-cost`` it counts the evictions
    before the load too.
    """

    task_id: TaskId
    serving: ServingTask
    ready_ms: float
    evicted: tuple[Eviction, ...]
    loaded: bool
    load_ms: float
    start_ms: float
    finish_ms: float
    oversized: bool = False  # the model is larger than the GPU: loaded anyway, alone

    @property
    def hit(self) -> bool:
        return bool(self.serving.model) and not self.loaded


class Ahead(NamedTuple):
    """A task queued on a GPU, as ``queue_wait`` plays it."""

    ready_ms: float
    model: str
    model_mb: float
    run_ms: float


def queue_wait(
    free_ms: float,
    resident: Iterable[str],
    ahead: Sequence[Ahead],
    ready_ms: float,
    mb_per_ms: float,
) -> float:
    """How long a task enqueued after ``ahead`` (in enqueue order), its inputs there at
    ``ready_ms``, waits for a GPU free at ``free_ms``: the queue played forward as
    ``GpuWorker.start`` takes it (the earliest enqueued of the tasks ready, the new
    one last), each task taking its run and, if its model is not resident (nor loaded
    by one before it), its load. The node agent's worker asks it of its queue, and
    the planner of the GPU as it sees it, so that they differ only in what they know."""
    at = free_ms
    models = set(resident)
    queue = list(ahead)
    while True:
        due = next((q for q in queue if q.ready_ms <= at), None)
        if due is not None:
            queue.remove(due)
            if due.model and due.model not in models:
                models.add(due.model)
                at += due.model_mb / mb_per_ms
            at += due.run_ms
        elif ready_ms <= at:
            return at - ready_ms
        else:  # the GPU idles till the next inputs arrive
            at = min([ready_ms, *(q.ready_ms for q in queue)])


class GpuWorker:
    """One GPU: ``capacity_mb`` of model cache, a serving queue, at most one task running."""

    def __init__(
        self,
        capacity_mb: float,
        host_to_gpu_mb_per_ms: float,
        resident: Mapping[str, float] | None = None,
        cache_model: CacheModel = CacheModel.LOOKAHEAD,
    ) -> None:
        if host_to_gpu_mb_per_ms <= 0:
            raise ValueError("host_to_gpu_mb_per_ms must be > 0")
        self.capacity_mb = capacity_mb
        self.host_to_gpu_mb_per_ms = host_to_gpu_mb_per_ms
        self.cache_model = cache_model
        self._resident: dict[str, float] = dict(resident or {})
        self._queue: list[Queued] = []
        self._seq = 0
        self._running: Start | None = None

    # -- what it holds -------------------------------------------------------

    @property
    def resident(self) -> Mapping[str, float]:
        """Model -> MB, least recently used first (``fifo-cost``: first loaded first; a
        copy)."""
        return dict(self._resident)

    @property
    def queue(self) -> tuple[Queued, ...]:
        return tuple(self._queue)

    @property
    def running(self) -> Start | None:
        return self._running

    @property
    def idle(self) -> bool:
        return self._running is None

    def load_ms(self, model_mb: float) -> float:
        return model_mb / self.host_to_gpu_mb_per_ms

    # -- what drives it ------------------------------------------------------

    def wait_ms(self, now_ms: float, ready_ms: float | None = None) -> float:
        """How long a task queued now, its inputs there at ``ready_ms`` (now if None),
        would wait for the GPU (``queue_wait`` over this queue)."""
        free = now_ms if self._running is None else max(now_ms, self._running.finish_ms)
        ahead = [  # the queue is kept in enqueue order
            Ahead(q.ready_ms, q.serving.model, q.serving.model_mb, q.serving.run_ms)
            for q in self._queue
        ]
        ready = now_ms if ready_ms is None else ready_ms
        return queue_wait(free, self._resident, ahead, ready, self.host_to_gpu_mb_per_ms)

    def refuses(self, serving: ServingTask, now_ms: float) -> float | None:
        """The wait (``wait_ms``, its inputs there ``input_delay_ms`` from now) when it
        exceeds the task's ``wait_limit_ms``: the GPU refuses the task rather than
        queue it; None when it takes it."""
        if serving.wait_limit_ms is None:
            return None
        wait = self.wait_ms(now_ms, now_ms + max(serving.input_delay_ms, 0.0))
        return wait if wait > serving.wait_limit_ms else None

    def enqueue(self, task_id: str, serving: ServingTask, ready_ms: float) -> bool:
        """Queue a dispatched task (as the decision names it); False (and nothing
        changes) if it is already here."""
        if self._has(task_id):
            return False
        self._queue.append(Queued(TaskId(task_id), serving, ready_ms, self._seq))
        self._seq += 1
        return True

    def remove(self, task_id: str) -> Queued | None:
        """Drop a queued (not running) task, e.g. on cancel; the removed entry or None."""
        for i, queued in enumerate(self._queue):
            if queued.task_id == task_id:
                return self._queue.pop(i)
        return None

    def next_ready_ms(self, now_ms: float | None = None) -> float | None:
        """The earliest ``ready_ms`` of a queued task (after ``now_ms`` when given), or None.

        A driver whose idle GPU got None from ``start`` wakes then.
        """
        times = [q.ready_ms for q in self._queue if now_ms is None or q.ready_ms > now_ms]
        return min(times, default=None)

    def start(self, now_ms: float) -> Start | None:
        """Start the next ready task if the GPU is idle; None if busy or nothing is ready."""
        if self._running is not None:
            return None
        ready = [q for q in self._queue if q.ready_ms <= now_ms]
        if not ready:
            return None
        task = min(ready, key=lambda q: q.seq)
        self._queue.remove(task)
        serving = task.serving
        evicted: tuple[Eviction, ...] = ()
        loaded = False
        oversized = False
        load = 0.0
        fifo = self.cache_model is CacheModel.FIFO_COST
        if serving.model in self._resident:
            if not fifo:
                self._resident[serving.model] = self._resident.pop(serving.model)  # most recent
        elif serving.model:
            evicted, oversized = self._make_room(task, now_ms)
            self._resident[serving.model] = serving.model_mb
            loaded = True
            load = self.load_ms(serving.model_mb)
            if fifo:  # each eviction moves its model off the GPU first
                load += sum(self.load_ms(e.size_mb) for e in evicted)
        begin = now_ms + load
        self._running = Start(
            task_id=task.task_id,
            serving=serving,
            ready_ms=task.ready_ms,
            evicted=evicted,
            loaded=loaded,
            load_ms=load,
            start_ms=begin,
            finish_ms=begin + serving.run_ms,
            oversized=oversized,
        )
        return self._running

    def finish(self, task_id: str) -> bool:
        """The running task ended (done, failed or stopped): the GPU is idle again.

        False (and nothing changes) when ``task_id`` is not the running task.
        Its model stays resident.
        """
        if self._running is None or self._running.task_id != task_id:
            return False
        self._running = None
        return True

    def evict_all(self, reason: str) -> tuple[Eviction, ...]:
        """Drop every cached model (a batch task takes the GPU), least recently used first.

        The running task's model, if any, stays: it is in use.
        """
        keep = self._running.serving.model if self._running is not None else ""
        dropped = tuple(
            Eviction(model, size, reason) for model, size in self._resident.items() if model != keep
        )
        for eviction in dropped:
            del self._resident[eviction.model]
        return dropped

    def forget(self, model: str) -> bool:
        """Drop a model that never became resident after all (its load was interrupted).

        Not an eviction: nothing to report. False if it is not resident.
        """
        return self._resident.pop(model, None) is not None

    # -- inside --------------------------------------------------------------

    def _has(self, task_id: str) -> bool:
        if self._running is not None and self._running.task_id == task_id:
            return True
        return any(q.task_id == task_id for q in self._queue)

    def _next_uses(self, task: Queued, now_ms: float) -> dict[str, float]:
        """When each model is next needed, as a position in the expected order.

        Queued tasks first, in the order ``start`` would take them (those ready
        now by enqueue order, then by ``ready_ms``); then the started task's
        planned ``upcoming`` models, soonest first.
        """
        order = sorted(
            self._queue,
            key=lambda q: (0, 0.0, q.seq) if q.ready_ms <= now_ms else (1, q.ready_ms, q.seq),
        )
        uses: dict[str, float] = {}
        position = 0
        for queued in order:
            if queued.serving.model:
                uses.setdefault(queued.serving.model, float(position))
            position += 1
        for model in task.serving.upcoming:
            if model:
                uses.setdefault(model, float(position))
            position += 1
        return uses

    def _make_room(self, task: Queued, now_ms: float) -> tuple[tuple[Eviction, ...], bool]:
        serving = task.serving
        # FIFO: no model counts as needed, so they go in the order they were loaded.
        fifo = self.cache_model is CacheModel.FIFO_COST
        uses = {} if fifo else self._next_uses(task, now_ms)
        pinned = frozenset({serving.model})
        victims = evict_for(
            serving.model_mb, self.capacity_mb, self._resident, uses, pinned, oldest_first=fifo
        )
        oversized = victims is None
        if victims is None:
            victims = tuple(m for m in self._resident if m not in pinned)
        room = f"room for {serving.model} ({task.task_id})"
        evicted: list[Eviction] = []
        for model in victims:
            if oversized:
                why = f"{room}: {serving.model} is larger than the GPU"
            elif fifo:
                why = f"{room}: loaded before the models kept"
            elif model in uses:
                why = f"{room}: next needed {int(uses[model]) + 1} tasks ahead, after those kept"
            else:
                why = f"{room}: no queued or upcoming task needs it"
            evicted.append(Eviction(model, self._resident.pop(model), why))
        return tuple(evicted), oversized
