"""A GPU's backlog played forward: when the GPU would take a new task, and which
models it would hold by then.

A GPU's backlog is what was sent to it or planned on it and has not started
(``GpuState.backlog``). A GPU takes its tasks first come, first served as
their inputs arrive, loading each one's model first when it is missing. A
``Timeline`` plays that forward: when the GPU would be done with every task
whose inputs arrive before a new task's, and which models it would hold by
then. A task planned for later (a successor whose parents still run) does not
delay a task ready now, and a model a queued task will load counts as resident
after it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from libs.core.compass.cache import miss_ms, use
from libs.core.compass.workflow import CacheModel, Costs, Task
from libs.core.ids import NodeId


@dataclass(frozen=True)
class Pending:
    """A task sent to a GPU, or planned on it, that has not started.

    ``ready_ms``: when its inputs arrive. ``sent``: it is in the GPU's queue;
    otherwise it is only planned there and ``ready_ms`` is an estimate, never
    taken as earlier than now (a planned task is sent once its parents end).
    """

    model: str  # empty: no model
    model_mb: float
    run_ms: float
    ready_ms: float
    sent: bool = True


@dataclass
class GpuState:
    """What the planner believes of one GPU; ``plan`` adds what it plans to ``backlog``.

    ``free_at_ms``: when the task running now ends (now or earlier: idle).
    ``resident``: the models in its memory, least recently used first.
    """

    gpu_id: str
    node_id: NodeId
    free_at_ms: float
    resident: dict[str, float] = field(default_factory=dict)  # model -> MB
    memory_mb: float = 0.0  # 0: the cluster-wide Costs.gpu_memory_mb
    backlog: tuple[Pending, ...] = ()


@dataclass(frozen=True)
class _Played:
    """What a timeline had played before an edit, kept in case the edit makes no
    difference past it: from index ``since`` on, index i is index i + ``shift`` here."""

    since: int
    shift: int
    ends: list[float]
    caches: list[dict[str, float]]
    gaps: list[int]  # in the old indexes


class Timeline:
    """One GPU's backlog played forward, first come first served by ``ready_ms``.

    ``end(k)``: when the GPU is done with the first ``k`` tasks; ``cache(k)``: the
    models it holds then, least recently used first (shared: never change one).
    Played lazily, as far as asked. Without ``reserve``, tasks only planned there
    are left out (``jit`` plans nothing: its hash placement is no reservation).

    ``insert`` and ``replace`` edit it in place: what was played before the edit
    stays, and what was played after it is taken up again as soon as playing the
    edit forward reaches the same end and cache (an edit that only moves a task
    within a busy stretch costs the stretch, not the rest of the queue).
    """

    def __init__(self, costs: Costs, gpu: GpuState, now_ms: float, reserve: bool) -> None:
        self.gpu_id = gpu.gpu_id
        self.node_id = gpu.node_id
        self.now_ms = now_ms
        self.costs = costs
        self.memory_mb = gpu.memory_mb or costs.gpu_memory_mb
        order = sorted(
            (p.ready_ms if p.sent else max(p.ready_ms, now_ms), not p.sent, i)
            for i, p in enumerate(gpu.backlog)
            if p.sent or reserve
        )
        self.keys = [(ready, unsent) for ready, unsent, _ in order]
        self.items = [gpu.backlog[i] for _, _, i in order]
        self._ends = [gpu.free_at_ms]
        self._caches = [dict(gpu.resident)]
        self._gaps: list[int] = []  # played tasks the GPU would wait for, idle: see earliest
        self._gap_keys: list[float] = []  # see earliest_begin; as far as it was asked
        self._played: _Played | None = None

    def __len__(self) -> int:
        return len(self.items)

    def find(self, item: Pending) -> int:
        """Where ``item`` (the very object) stands."""
        key = (item.ready_ms if item.sent else max(item.ready_ms, self.now_ms), not item.sent)
        at = bisect.bisect_left(self.keys, key)
        while self.items[at] is not item:
            at += 1
        return at

    def slot(self, ready_ms: float) -> int:
        """How many tasks go before one whose inputs arrive at ``ready_ms``: those
        whose inputs arrive earlier, and those sent already that arrive with it."""
        return bisect.bisect_left(self.keys, (ready_ms, True))

    def fit(self, task: Task, ready_ms: float, insertion: bool) -> int:
        """Where a task ready at ``ready_ms`` goes: in its turn or, with ``insertion``
        (HEFT's), in the first gap from then on that holds its load and run without
        delaying what is queued or planned after it."""
        found = self.earliest(task, ready_ms, insertion, math.inf)
        assert found is not None  # nothing is later than inf
        return found[0]

    def earliest(
        self, task: Task, ready_ms: float, insertion: bool, limit: float
    ) -> tuple[int, float] | None:
        """``fit``, and when the GPU would take the task there (``begin``); None as soon
        as that is sure to be later than ``limit``."""
        k = bisect.bisect_left(self.keys, (ready_ms, True))  # slot
        if not insertion:
            begin = self.begin(k, ready_ms)
            return None if begin > limit else (k, begin)
        # A task that takes time fits only where the GPU would sit idle, waiting for
        # the next task's inputs (a gap): visit those alone, not every task after k,
        # and play the queue forward only as far as the limit.
        ends, count, model = self._ends, len(self.items), task.model
        load = self.costs.load_ms(task.model_mb) if model else 0.0
        costly = self.costs.cache_model is CacheModel.FIFO_COST  # a miss costs by the cache
        j: int | None = k
        while j is not None:
            j = self._next_gap(j, limit)
            if not (self.end(k) >= 0 and task.run_ms > math.ulp(self._ends[-1])):
                break  # a run so short that it could round away at a busy place
            if j is None:
                return None  # busy past the limit: every later place begins later still
            begin = max(ends[j], ready_ms)
            if begin > limit:
                return None
            if j == count:
                return j, begin
            need = task.run_ms
            if model and model not in self._caches[j]:
                need += self._miss_ms(task.model_mb, self._caches[j]) if costly else load
            if begin + need <= max(ends[j], self.keys[j][0]):  # _fits_before, inlined: hot
                return j, begin
            j += 1
        # Try every place from k on (rare: see above).
        j = next((j for j in range(k, count) if self._fits_before(task, ready_ms, j)), count)
        begin = self.begin(j, ready_ms)
        return None if begin > limit else (j, begin)

    def _next_gap(self, k: int, limit: float) -> int | None:
        """The first task from the ``k``-th on that the GPU would wait for, idle (its
        inputs arrive after the GPU is done with those before it), playing the queue
        forward as far as needed; ``len`` if none, None once the GPU is busy past
        ``limit`` before finding one."""
        while True:
            i = bisect.bisect_left(self._gaps, k)
            if i < len(self._gaps):
                return self._gaps[i]
            played = len(self._ends) - 1  # whether a gap is known for the tasks before
            if played >= len(self.items):
                return len(self.items)
            if self._ends[-1] > limit:
                return None
            self._play(played + 1)

    def _fits_before(self, task: Task, ready_ms: float, j: int) -> bool:
        need = task.run_ms
        if task.model and task.model not in self.cache(j):
            need += self._miss_ms(task.model_mb, self.cache(j))
        return self.begin(j, ready_ms) + need <= self.begin(j, self.keys[j][0])

    def _miss_ms(self, size_mb: float, cache: dict[str, float]) -> float:
        return miss_ms(self.costs, size_mb, cache, self.memory_mb)

    def begin(self, k: int, ready_ms: float) -> float:
        """When the GPU would take a task ready at ``ready_ms`` after the first ``k``."""
        return max(self.end(k), ready_ms)

    def end(self, k: int) -> float:
        if k >= len(self._ends):
            self._play(k)
        return self._ends[k]

    def cache(self, k: int) -> dict[str, float]:
        if k >= len(self._ends):
            self._play(k)
        return self._caches[k]

    def earliest_begin(self, ready_ms: float) -> float:
        """No task ready at ``ready_ms`` begins here earlier, unless its run is so short
        that it rounds away there: it fits only into a gap whose next task is ready
        later than it (see ``earliest``), and the GPU is busy until the first of those
        (or the end of what was played so far)."""
        gaps, latest = self._gaps, self._gap_keys
        while len(latest) < len(gaps):  # the latest key of the gaps so far
            key = self.keys[gaps[len(latest)]][0]
            latest.append(max(latest[-1], key) if latest else key)
        at = bisect.bisect_right(latest, ready_ms)
        end = self._ends[gaps[at]] if at < len(gaps) else self._ends[-1]
        return max(ready_ms, end) if self._ends[0] >= 0 else -math.inf

    def wait(self, ready_ms: float) -> float:
        """How long a task ready at ``ready_ms`` would wait (before any load)."""
        return self.begin(self.slot(ready_ms), ready_ms) - ready_ms

    def insert(self, k: int, item: Pending) -> None:
        """Put ``item`` at ``k`` (``fit`` says where)."""
        self.keys.insert(k, (item.ready_ms, not item.sent))
        self.items.insert(k, item)
        self._edited(k, k, -1)

    def replace(self, k: int | None, sent: Pending | None) -> None:
        """Take out the task at ``k`` and put in ``sent``, a task sent here, in its turn
        (after those sent with it); either may be None."""
        if k is not None:
            del self.keys[k]
            del self.items[k]
        if sent is None:
            if k is not None:
                self._edited(k, k - 1, 1)
            return
        key = (sent.ready_ms, False)
        at = bisect.bisect_right(self.keys, key)
        self.keys.insert(at, key)
        self.items.insert(at, sent)
        if k is None:
            self._edited(at, at, -1)
        else:
            self._edited(min(k, at), max(k, at), 0)

    def _edited(self, low: int, high: int, shift: int) -> None:
        """The tasks before ``low`` are as they were, and from ``high`` + 1 on each
        index i holds the task of old index i + ``shift``."""
        since = high + 1
        cut = bisect.bisect_left(self._gaps, low)
        if len(self._ends) > since + shift:  # played past the edit: keep that aside
            self._played = _Played(since, shift, self._ends, self._caches, self._gaps)
            self._ends = self._ends[: low + 1]
            self._caches = self._caches[: low + 1]
            self._gaps = self._gaps[:cut]
        else:
            self._played = None
            del self._ends[low + 1 :]
            del self._caches[low + 1 :]
            del self._gaps[cut:]
        del self._gap_keys[cut:]

    def _play(self, k: int) -> None:
        fifo = self.costs.cache_model is CacheModel.FIFO_COST
        while len(self._ends) <= k:
            j = len(self._ends) - 1
            item = self.items[j]
            cache = self._caches[j]
            if self._ends[j] < self.keys[j][0]:
                self._gaps.append(j)
            missed = bool(item.model) and item.model not in cache
            load = self._miss_ms(item.model_mb, cache) if missed else 0.0
            # A cache changes when it misses, and with LRU when a model not the most
            # recent is used.
            if missed or (item.model and not fifo and next(reversed(cache)) != item.model):
                cache = dict(cache)
                use(cache, item.model, item.model_mb, self.memory_mb, fifo)
            self._ends.append(max(self._ends[j], self.keys[j][0]) + load + item.run_ms)
            self._caches.append(cache)
            if self._played is not None and j + 1 >= self._played.since:
                self._resume(j + 1)

    def _resume(self, i: int) -> None:
        """Take up what was played before the last edit if index ``i`` ends as it did."""
        played = self._played
        assert played is not None
        old = i + played.shift
        if old >= len(played.ends):
            self._played = None
            return
        cache, before = self._caches[i], played.caches[old]
        if self._ends[i] != played.ends[old] or (
            cache is not before and list(cache.items()) != list(before.items())
        ):
            return
        self._ends.extend(played.ends[old + 1 :])
        self._caches.extend(played.caches[old + 1 :])
        kept = played.gaps[bisect.bisect_left(played.gaps, old) :]
        self._gaps.extend(g - played.shift for g in kept)
        self._played = None
