"""Planning a workflow onto GPUs: Compass, and the baselines it is compared with.

``compass`` ranks tasks HEFT-style (upward rank, transfers included) and gives
each the GPU with the earliest estimated start: when the GPU would take the
task (its backlog played forward, below), plus the model load when the model
will not be resident then, plus an eviction penalty (the reload cost of what
must make room). ``heft`` plans the same way but blind to loads and caches.
``hash`` and ``jit`` place by a stable hash of the task; ``jit`` then
re-routes every task when it becomes ready. ``adjust`` is Compass's run-time
correction.

A GPU's backlog is what was sent to it or planned on it and has not started
(``GpuState.backlog``). A GPU takes its tasks first come, first served as
their inputs arrive, loading each one's model first when it is missing. The
planner plays that forward: when the GPU would be done with every task whose
inputs arrive before a new task's, and which models it would hold by then.
A task planned for later (a successor whose parents still run) does not delay
a task ready now, and a model a queued task will load counts as resident
after it. Ties between GPUs go to the lower ``gpu_id``: plans are
deterministic and pack onto few GPUs when the cluster is lightly loaded.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libs.core.compass.cache import evict_for
from libs.core.compass.workflow import Costs, Task, Workflow


class PlanMode(enum.Enum):
    COMPASS = "compass"
    HEFT = "heft"
    HASH = "hash"
    JIT = "jit"


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
    node_id: str
    free_at_ms: float
    resident: dict[str, float] = field(default_factory=dict)  # model -> MB
    memory_mb: float = 0.0  # 0: the cluster-wide Costs.gpu_memory_mb
    backlog: tuple[Pending, ...] = ()


@dataclass(frozen=True)
class Assignment:
    task_id: str
    gpu_id: str
    start_ms: float  # when the task starts running (after any load)
    finish_ms: float
    load_ms: float  # 0 on a cache hit
    ready_ms: float = 0.0  # when its inputs arrive there (estimated)
    wait_ms: float = 0.0  # from then until the GPU takes it: the queue ahead of it


@dataclass(frozen=True)
class Input:
    """Where one parent of a ready task ran and when it ended (for ``adjust``)."""

    node_id: str
    finish_ms: float


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

    def __init__(self, planner: Planner, gpu: GpuState, now_ms: float, reserve: bool) -> None:
        self.gpu_id = gpu.gpu_id
        self.node_id = gpu.node_id
        self.now_ms = now_ms
        self.costs = planner.costs
        self.use = planner.use
        self.memory_mb = gpu.memory_mb or planner.costs.gpu_memory_mb
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
                need += load
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
            need += self.costs.load_ms(task.model_mb)
        return self.begin(j, ready_ms) + need <= self.begin(j, self.keys[j][0])

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
        while len(self._ends) <= k:
            j = len(self._ends) - 1
            item = self.items[j]
            cache = self._caches[j]
            if self._ends[j] < self.keys[j][0]:
                self._gaps.append(j)
            load = 0.0
            if item.model and item.model not in cache:
                load = self.costs.load_ms(item.model_mb)
            if item.model and next(reversed(cache), None) != item.model:
                cache = dict(cache)
                self.use(cache, item.model, item.model_mb, self.memory_mb)
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


class _Arrivals:
    """When a task's inputs reach each node: an input moves for free within its node
    and for the same transfer time between any two nodes, so at a node the latest is
    the latest that ended there or the latest from elsewhere, transfer included. A
    few maxima over the parents, then O(1) for each node asked."""

    def __init__(self, now_ms: float, moved_ms: float, local: dict[str, float]) -> None:
        self.now_ms = now_ms
        self.moved_ms = moved_ms
        self.local = local  # node -> when its last parent there ends
        # The latest parent end and, on another node than that one's, the next latest.
        self.top_node, self.top, self.runner_up = "", -math.inf, -math.inf
        for node_id, end in local.items():
            if end > self.top:
                self.top_node, self.top, self.runner_up = node_id, end, self.top
            elif end > self.runner_up:
                self.runner_up = end
        self.elsewhere = max(now_ms, self.top + moved_ms)  # at a node without parents

    def at(self, node_id: str) -> float:
        local = self.local.get(node_id)
        if local is None:
            return self.elsewhere
        other = self.runner_up if node_id == self.top_node else self.top
        return max(self.now_ms, local, other + self.moved_ms)


class _Shortlist:
    """The GPUs a plan weighs for a task, less those sure not to start it first.

    Weighing every GPU for every task costs tasks × GPUs; this leaves out, without
    changing any choice (the earliest start wins, ties the lowest id):
    - of GPUs with nothing queued that are alike (models, memory, when free) and
      get the task's inputs at the same time (on the same node, or on none of its
      parents' nodes), all but the lowest id: they would start it alike;
    - GPUs with a queue that would take the task later than the best start found
      (``Timeline.earliest_begin``, weighed in that order): a load and an eviction
      only add to it.
    """

    def __init__(self, gpus: Sequence[GpuState], lines: dict[str, Timeline]) -> None:
        self.lines = lines
        self.node_of = {g.gpu_id: g.node_id for g in gpus}
        # alike -> node -> ids with nothing queued, lowest first
        self.idle: dict[tuple[object, ...], dict[str, list[str]]] = {}
        self.queued: dict[str, None] = {}
        for gpu in gpus:
            if len(lines[gpu.gpu_id]):
                self.queued[gpu.gpu_id] = None
            else:
                alike = (gpu.free_at_ms, tuple(gpu.resident.items()), lines[gpu.gpu_id].memory_mb)
                on_node = self.idle.setdefault(alike, {}).setdefault(gpu.node_id, [])
                bisect.insort(on_node, gpu.gpu_id)

    def weigh(self, task: Task, arrivals: _Arrivals, start: Callable[[str, float], float]) -> None:
        """Call ``start(gpu id, best start so far)`` for each GPU on the shortlist;
        it returns the best start after weighing that GPU."""
        best = math.inf
        for by_node in self.idle.values():
            elsewhere = ""  # the lowest id off the parents' nodes
            for node, ids in by_node.items():
                if not ids:
                    continue
                if node in arrivals.local:
                    best = start(ids[0], best)
                elif not elsewhere or ids[0] < elsewhere:
                    elsewhere = ids[0]
            if elsewhere:
                best = start(elsewhere, best)
        lines, node_of, ready = self.lines, self.node_of, arrivals.at
        bounds = sorted((lines[g].earliest_begin(ready(node_of[g])), g) for g in self.queued)
        for bound, gpu_id in bounds:
            # A run so short that it could round away at a busy place: no shortcut.
            if bound <= best or not task.run_ms > math.ulp(bound):
                best = start(gpu_id, best)

    def changed(self, gpu_id: str) -> None:
        """The GPU's timeline got a task."""
        if gpu_id not in self.queued:
            for by_node in self.idle.values():
                ids = by_node.get(self.node_of[gpu_id], [])
                if gpu_id in ids:
                    ids.remove(gpu_id)
                    break
            self.queued[gpu_id] = None


class _Choice:
    """The GPU a plan gives one task: the earliest start, ties to the lowest id."""

    def __init__(
        self,
        planner: Planner,
        task: Task,
        arrivals: _Arrivals,
        lines: dict[str, Timeline],
        node_of: dict[str, str],
        insertion: bool,
    ) -> None:
        self.planner = planner
        self.task = task
        self.arrivals = arrivals
        self.lines = lines
        self.node_of = node_of
        self.insertion = insertion
        self.aware = planner.mode is not PlanMode.HEFT  # of loads and caches
        # (start, gpu id, place in its timeline, ready, begin, load)
        self.best: tuple[float, str, int, float, float, float] | None = None

    def weigh(self, gpu_id: str, limit: float) -> float:
        """Weigh one GPU against the best start so far (``limit``); the best after it."""
        task, line = self.task, self.lines[gpu_id]
        ready = self.arrivals.at(self.node_of[gpu_id])
        # A load and an eviction only add to when the GPU would take it: a GPU
        # that takes it later than the best start so far is not looked at further.
        found = line.earliest(task, ready, self.insertion, limit)
        if found is None:
            return limit
        k, begin = found
        start = begin
        cache = line.cache(k)
        load = self.planner._load_ms(task, cache)
        if self.aware:
            start += load + self.planner._penalty(task, cache, line.memory_mb)
        if self.best is None or (start, gpu_id) < self.best[:2]:
            self.best = (start, gpu_id, k, ready, begin, load)
        return self.best[0]


class Planner:
    def __init__(self, costs: Costs, mode: PlanMode = PlanMode.COMPASS) -> None:
        self.costs = costs
        self.mode = mode

    def upward_ranks(self, workflow: Workflow) -> dict[str, float]:
        ranks: dict[str, float] = {}
        for task in reversed(workflow.tasks):
            tail = max(
                (
                    self.costs.transfer_ms(task.out_kb, same_node=False) + ranks[child]
                    for child in workflow.children(task.task_id)
                ),
                default=0.0,
            )
            ranks[task.task_id] = task.run_ms + tail
        return ranks

    def plan(
        self, workflow: Workflow, gpus: Sequence[GpuState], now_ms: float, job_id: str = ""
    ) -> list[Assignment]:
        """Assign every task of one job; each joins its GPU's ``backlog`` (not sent).

        The hash baselines hash the job and the task, spreading jobs over all GPUs.
        """
        ranks = self.upward_ranks(workflow)
        order = sorted(
            range(len(workflow.tasks)), key=lambda i: (-ranks[workflow.tasks[i].task_id], i)
        )
        timelines = {g.gpu_id: Timeline(self, g, now_ms, reserve=True) for g in gpus}
        node_of = {g.gpu_id: g.node_id for g in gpus}
        by_id = {g.gpu_id: g for g in gpus}
        hashed = self.mode in (PlanMode.HASH, PlanMode.JIT)
        shortlist = None if hashed else _Shortlist(gpus, timelines)
        insertion = not hashed  # compass and heft
        done: dict[str, Assignment] = {}
        added: dict[str, list[Pending]] = {}  # gpu id -> what this plan puts in its backlog
        for task in (workflow.tasks[i] for i in order):
            arrivals = self._arrivals(task, done, node_of, now_ms)
            choose = _Choice(self, task, arrivals, timelines, node_of, insertion)
            if shortlist is None:
                key = f"{job_id}/{workflow.name}/{task.task_id}"
                choose.weigh(gpus[_stable_hash(key) % len(gpus)].gpu_id, math.inf)
            else:
                shortlist.weigh(task, arrivals, choose.weigh)
            assert choose.best is not None  # every GPU was weighed or ruled out by one
            start, gpu_id, k, ready, begin, load = choose.best
            choice = Assignment(
                task.task_id, gpu_id, start, start + task.run_ms, load, ready, begin - ready
            )
            done[task.task_id] = choice
            item = Pending(task.model, task.model_mb, task.run_ms, choice.ready_ms, sent=False)
            timelines[choice.gpu_id].insert(k, item)
            if shortlist is not None:
                shortlist.changed(choice.gpu_id)
            added.setdefault(choice.gpu_id, []).append(item)
        for gpu_id, items in added.items():
            gpu = by_id[gpu_id]
            gpu.backlog = (*gpu.backlog, *items)
        return [done[t.task_id] for t in workflow.tasks]

    def adjust(
        self,
        task: Task,
        planned: GpuState,
        gpus: Sequence[GpuState],
        ready_ms: float,
        threshold: float = 1.5,
        *,
        inputs: Sequence[Input] = (),
    ) -> GpuState:
        """Re-place a ready task whose planned GPU would keep it waiting longer than
        ``threshold`` × its run time (``threshold`` 0: always take the GPU where it
        would start first). ``planned``'s backlog must not hold the task itself.

        The wait on the planned GPU is for what goes before the task there. Elsewhere
        the task is weighed as in ``plan``: when the GPU would take it (its inputs
        moved from the parents' nodes, ``inputs``), the model load and the eviction
        penalty; ``compass`` moves it only into gaps that delay nothing planned.
        Ties keep the planned GPU. ``gpus`` are not changed.
        """
        reserve = self.mode is not PlanMode.JIT
        own = Timeline(self, planned, ready_ms, reserve)
        lines = {Timeline(self, g, ready_ms, reserve): g for g in gpus if g is not planned}
        chosen = self.adjust_lines(task, own, list(lines), ready_ms, threshold, inputs=inputs)
        return planned if chosen is own else lines[chosen]

    def adjust_lines(
        self,
        task: Task,
        own: Timeline,
        lines: Sequence[Timeline],
        ready_ms: float,
        threshold: float = 1.5,
        *,
        inputs: Sequence[Input] = (),
    ) -> Timeline:
        """``adjust`` on the GPUs' timelines as of ``ready_ms`` (built with tasks only
        planned there left out for ``jit``): ``own`` is the planned GPU's, without the
        task, and is returned when the task stays. A caller that keeps timelines up to
        date saves building one per GPU for every task it sends."""
        # jit re-routes to the lowest wait plus load; compass weighs what it plans by:
        # input transfers, the load and the eviction penalty, reservations kept.
        aware = self.mode is not PlanMode.JIT
        own_ready = self.ready_at(task, own.node_id, ready_ms, inputs) if aware else ready_ms
        k = own.slot(own_ready)
        if threshold and own.begin(k, own_ready) - own_ready <= threshold * task.run_ms:
            return own
        insertion = self.mode is PlanMode.COMPASS

        def cost(line: Timeline, j: int) -> float:
            cache = line.cache(j)
            load = self._load_ms(task, cache)
            return load + self._penalty(task, cache, line.memory_mb) if aware else load

        # The earliest start wins; ties keep the planned GPU, then go to the lowest id.
        best = (own.begin(k, own_ready) + cost(own, k), False, own.gpu_id)
        chosen = own
        others = [
            (self.ready_at(task, line.node_id, ready_ms, inputs) if aware else ready_ms, line)
            for line in lines
            if line is not own
        ]
        if insertion:  # the GPUs that may take it soonest first (see Timeline.earliest_begin)
            others.sort(key=lambda other: (other[1].earliest_begin(other[0]), other[1].gpu_id))
        for ready, line in others:
            if insertion:
                bound = line.earliest_begin(ready)
                if bound > best[0] and task.run_ms > math.ulp(bound):
                    continue
            # A load and an eviction only add: a GPU that takes it later is not weighed.
            found = line.earliest(task, ready, insertion, best[0])
            if found is None:
                continue
            j, begin = found
            candidate = (begin + cost(line, j), True, line.gpu_id)
            if candidate < best:
                best, chosen = candidate, line
        return chosen

    def ready_at(
        self, task: Task, node_id: str, ready_ms: float, inputs: Sequence[Input] = ()
    ) -> float:
        """When the task's inputs reach ``node_id``: ``ready_ms`` or, if later, when
        the last one arrives from where its parent ran (``inputs``)."""
        moved = (
            i.finish_ms + self.costs.transfer_ms(task.in_kb, i.node_id == node_id) for i in inputs
        )
        return max(ready_ms, max(moved, default=ready_ms))

    def wait_ms(self, gpu: GpuState, ready_ms: float) -> float:
        """How long a task ready at ``ready_ms`` would wait for ``gpu`` (before any load),
        behind what was sent there and what is planned to arrive before it."""
        return Timeline(self, gpu, ready_ms, reserve=self.mode is not PlanMode.JIT).wait(ready_ms)

    def use(self, cache: dict[str, float], model: str, size_mb: float, memory_mb: float) -> None:
        """``model`` runs next with ``cache``: it becomes resident and most recently used,
        evicting the least recently used models to make room."""
        if not model:
            return
        if model in cache:
            cache[model] = cache.pop(model)
            return
        victims = evict_for(size_mb, memory_mb, cache, {}, oldest_first=True)
        if victims is None:
            return
        for victim in victims:
            del cache[victim]
        cache[model] = size_mb

    def _arrivals(
        self,
        task: Task,
        done: dict[str, Assignment],
        node_of: dict[str, str],
        now_ms: float,
    ) -> _Arrivals:
        """When the task's inputs would reach each node, as planned (see _Arrivals)."""
        moved = self.costs.transfer_ms(task.in_kb, same_node=False)
        local: dict[str, float] = {}  # node -> when its last parent there ends
        for parent in task.parents:
            assignment = done[parent]
            node_id = node_of[assignment.gpu_id]
            local[node_id] = max(local.get(node_id, assignment.finish_ms), assignment.finish_ms)
        return _Arrivals(now_ms, moved, local)

    def _load_ms(self, task: Task, cache: dict[str, float]) -> float:
        if not task.model or task.model in cache:
            return 0.0
        return self.costs.load_ms(task.model_mb)

    def _penalty(self, task: Task, cache: dict[str, float], memory_mb: float) -> float:
        """What making room costs later: reloading the models it evicts."""
        if not task.model or task.model in cache:
            return 0.0
        victims = evict_for(task.model_mb, memory_mb, cache, {}, oldest_first=True)
        if victims is None:
            return float("inf")
        return sum(self.costs.load_ms(cache[m]) for m in victims)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
