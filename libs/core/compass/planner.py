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


class _Timeline:
    """One GPU's backlog played forward, first come first served by ``ready_ms``.

    ``end(k)``: when the GPU is done with the first ``k`` tasks; ``cache(k)``: the
    models it holds then, least recently used first (shared: never change one).
    Played lazily, as far as asked. Without ``reserve``, tasks only planned there
    are left out (``jit`` plans nothing: its hash placement is no reservation).
    """

    def __init__(self, planner: Planner, gpu: GpuState, now_ms: float, reserve: bool) -> None:
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

    def __len__(self) -> int:
        return len(self.items)

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
        # the next task's inputs (a gap): visit those alone, not every task after k.
        count = len(self.items)
        self._play(count)
        ends, gaps = self._ends, self._gaps
        if not (ends[k] >= 0 and task.run_ms > math.ulp(ends[count])):
            # A run so short that it could round away at a busy place: try every place.
            j = next((j for j in range(k, count) if self._fits_before(task, ready_ms, j)), count)
            begin = max(ends[j], ready_ms)
            return None if begin > limit else (j, begin)
        keys, caches, model = self.keys, self._caches, task.model
        load = self.costs.load_ms(task.model_mb) if model else 0.0
        i = bisect.bisect_left(gaps, k)
        while True:
            j = gaps[i] if i < len(gaps) else count
            begin = max(ends[j], ready_ms)
            if begin > limit:
                return None  # ends only grow: every later place begins later still
            if j == count:
                return j, begin
            need = task.run_ms
            if model and model not in caches[j]:
                need += load
            if begin + need <= max(ends[j], keys[j][0]):  # _fits_before, inlined: hot
                return j, begin
            i += 1

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

    def insert(self, k: int, item: Pending) -> None:
        self.keys.insert(k, (item.ready_ms, not item.sent))
        self.items.insert(k, item)
        del self._ends[k + 1 :]
        del self._caches[k + 1 :]
        del self._gaps[bisect.bisect_left(self._gaps, k) :]

    def _play(self, k: int) -> None:
        for j in range(len(self._ends) - 1, k):
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
        timelines = {g.gpu_id: _Timeline(self, g, now_ms, reserve=True) for g in gpus}
        node_of = {g.gpu_id: g.node_id for g in gpus}
        by_id = {g.gpu_id: g for g in gpus}
        insertion = self.mode in (PlanMode.COMPASS, PlanMode.HEFT)
        aware = self.mode is not PlanMode.HEFT
        done: dict[str, Assignment] = {}
        added: dict[str, list[Pending]] = {}  # gpu id -> what this plan puts in its backlog
        for task in (workflow.tasks[i] for i in order):
            if self.mode in (PlanMode.HASH, PlanMode.JIT):
                hashed = gpus[_stable_hash(f"{job_id}/{workflow.name}/{task.task_id}") % len(gpus)]
                candidates: Sequence[GpuState] = (hashed,)
            else:
                candidates = gpus
            arrival = self._arrivals(task, done, node_of, now_ms)
            best: tuple[float, str, int, float, float, float] | None = None
            for gpu in candidates:
                ready = arrival(gpu.node_id)
                line = timelines[gpu.gpu_id]
                # A load and an eviction only add to when the GPU would take it: a GPU
                # that takes it later than the best start so far is not looked at further.
                found = line.earliest(task, ready, insertion, math.inf if best is None else best[0])
                if found is None:
                    continue
                k, begin = found
                start = begin
                cache = line.cache(k)
                load = self._load_ms(task, cache)
                if aware:
                    start += load + self._penalty(task, cache, line.memory_mb)
                if best is None or (start, gpu.gpu_id) < best[:2]:
                    best = (start, gpu.gpu_id, k, ready, begin, load)
            assert best is not None
            start, gpu_id, k, ready, begin, load = best
            choice = Assignment(
                task.task_id, gpu_id, start, start + task.run_ms, load, ready, begin - ready
            )
            done[task.task_id] = choice
            item = Pending(task.model, task.model_mb, task.run_ms, choice.ready_ms, sent=False)
            timelines[choice.gpu_id].insert(k, item)
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
        # jit re-routes to the lowest wait plus load; compass weighs what it plans by:
        # input transfers, the load and the eviction penalty, reservations kept.
        reserve = aware = self.mode is not PlanMode.JIT

        def arrival(g: GpuState) -> float:
            if not aware:
                return ready_ms
            moved = (
                i.finish_ms + self.costs.transfer_ms(task.in_kb, i.node_id == g.node_id)
                for i in inputs
            )
            return max(ready_ms, max(moved, default=ready_ms))

        own = _Timeline(self, planned, ready_ms, reserve)
        own_ready = arrival(planned)
        k = own.slot(own_ready)
        if threshold and own.begin(k, own_ready) - own_ready <= threshold * task.run_ms:
            return planned
        insertion = self.mode is PlanMode.COMPASS

        def start(g: GpuState) -> tuple[float, bool, str]:
            if g is planned:
                line, ready, j = own, own_ready, k
            else:
                line = _Timeline(self, g, ready_ms, reserve)
                ready = arrival(g)
                j = line.fit(task, ready, insertion)
            cache = line.cache(j)
            cost = self._load_ms(task, cache)
            if aware:
                cost += self._penalty(task, cache, line.memory_mb)
            return line.begin(j, ready) + cost, g is not planned, g.gpu_id

        candidates = list(gpus) if any(g is planned for g in gpus) else [planned, *gpus]
        return min(candidates, key=start)

    def wait_ms(self, gpu: GpuState, ready_ms: float) -> float:
        """How long a task ready at ``ready_ms`` would wait for ``gpu`` (before any load),
        behind what was sent there and what is planned to arrive before it."""
        line = _Timeline(self, gpu, ready_ms, reserve=self.mode is not PlanMode.JIT)
        return line.begin(line.slot(ready_ms), ready_ms) - ready_ms

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
    ) -> Callable[[str], float]:
        """When the task's inputs would reach a node, as planned, node by node.

        An input moves for free within its node and for the same transfer time
        between any two nodes, so the latest input to reach a node is the latest
        that ended there or the latest (transfer included) from elsewhere: a few
        maxima over the parents, then O(1) for each node asked.
        """
        moved = self.costs.transfer_ms(task.in_kb, same_node=False)
        local: dict[str, float] = {}  # node -> when its last parent there ends
        for parent in task.parents:
            assignment = done[parent]
            node_id = node_of[assignment.gpu_id]
            local[node_id] = max(local.get(node_id, assignment.finish_ms), assignment.finish_ms)
        # The latest parent end and, on another node than that one's, the next latest.
        top_node, top, runner_up = "", -math.inf, -math.inf
        for node_id, end in local.items():
            if end > top:
                top_node, top, runner_up = node_id, end, top
            elif end > runner_up:
                runner_up = end

        def arrival(node_id: str) -> float:
            elsewhere = runner_up if node_id == top_node else top
            return max(now_ms, local.get(node_id, now_ms), elsewhere + moved)

        return arrival

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
