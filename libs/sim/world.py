"""The simulated cluster every simulator drives: nodes and their GPUs, the tasks on them,
a clock, an agenda, and what node agents do with the scheduler's decisions.

The trace simulator (``libs.sim.driver``), the workflow sweep (``libs.sim.workflows``),
the mixed cluster (``libs.sim.mixed``), the property tests, the core benchmarks and the
golden recorder (``tests/golden/record.py``) run their tasks here. What a node agent does
is decided once:

* A batch ``Place`` claims its GPUs at once; a GPU given twice, or one its node does not
  have, stops the run (``SimulationError``). Models cached on a GPU a batch task takes
  are evicted first (``ModelEvicted``, reported at once). The task reports
  ``TaskStarted`` ``start_delay_s`` later.
* A batch task ends (``TaskEnded``, its GPUs free) when its driver says so, or
  ``stop_grace_s`` after a ``Stop`` (or the stop's shorter ``grace_s``) with exit
  ``stopped_exit`` (``stop``); trace jobs end when their work runs out
  (``libs.sim.batch``).
* A serving ``Place`` enters its GPU's queue (a ``GpuWorker``) when its inputs have
  arrived, ``input_delay_ms`` later; a GPU whose queue would keep it waiting past its
  ``wait_limit_ms`` refuses it instead (``TaskRefused``, at once). When the GPU takes
  it: ``ModelEvicted`` at once for each model it makes room with, ``ModelLoaded`` when
  the load is done, ``TaskStarted`` then, and ``TaskEnded`` ``run_ms`` later; the GPU
  then takes its next task.

Time runs in the driver's unit, ``per_s`` to a second (1: seconds, 1000: ms); inputs
carry seconds and GPU workers milliseconds, each converted where it is made, so every
simulator keeps its arithmetic, and so its figures. The agenda runs entries by time,
then rank (``ranks``, by payload type; 0 otherwise), then in the order they were made.
Reports due now go to ``deliver``: the driver says whether the scheduler hears them at
once or after what it is already handling (by default: next on the agenda). The world
is plain state changed by its methods; it reads no clock and draws no random number.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from libs.core.compass import CacheModel, GpuWorker
from libs.core.compass.serving import MB_PER_GIB
from libs.core.compass.worker import Start
from libs.core.decisions import Place, ServingHeld, ServingReleased, stop_grace
from libs.core.ids import JobId, NodeId, TaskId
from libs.core.inputs import (
    Input,
    ModelEvicted,
    ModelLoaded,
    TaskEnded,
    TaskRefused,
    TaskStarted,
    UsageSnapshot,
)
from libs.core.model import JobSpec, NodeSpec
from libs.core.usage import WindowedUsage

GpuKey = tuple[str, int]
SIGTERM_EXIT = 143  # a shell's exit code for a process ended by SIGTERM


class SimulationError(RuntimeError):
    """The scheduler broke a rule no scheduler may break; the message says which."""


@dataclass(frozen=True)
class Task:
    """A placed task, holding its GPUs (batch) or queued on one (serving)."""

    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    gpus: tuple[int, ...]
    spec: JobSpec
    serving: bool


@dataclass(frozen=True)
class Served:
    """A serving task a GPU took: what it waited for, loaded and ran (for the figures)."""

    task: Task
    name: str  # the workflow's own task name
    transfer_ms: float  # its inputs' transfer, before it could queue
    taken_ms: float  # when the GPU took it
    begun: Start


@dataclass(frozen=True)
class _Wake:
    """A GPU may take its next serving task."""

    gpu: GpuKey


@dataclass(frozen=True)
class _Finish:
    """A serving task's run is over."""

    task_id: str


@dataclass(frozen=True)
class _End:
    """A batch task ends (its stop's grace is over), unless it is gone already."""

    task: Task
    exit_code: int


class World:
    """One simulated cluster; its driver feeds the scheduler and hands the decisions here."""

    def __init__(
        self,
        *,
        per_s: float = 1.0,
        start_delay_s: float = 0.0,
        stop_grace_s: float = 30.0,
        stopped_exit: int = SIGTERM_EXIT,
        host_to_gpu_mb_per_ms: float | None = None,  # None: no model caches
        cache_model: CacheModel = CacheModel.LOOKAHEAD,  # how those caches make room
        ranks: Mapping[type, int] | None = None,
        deliver: Callable[[Input], None] | None = None,
        digits: int | None = None,  # agenda times rounded so (a log keeps ms: 3)
    ) -> None:
        self.per_s = per_s
        self.now = 0.0  # in the driver's unit
        self.start_delay_s = start_delay_s
        self.stop_grace_s = stop_grace_s
        self.stopped_exit = stopped_exit
        self._bandwidth = host_to_gpu_mb_per_ms
        self._cache_model = cache_model
        self._ranks = dict(ranks or {})
        self._digits = digits
        self.deliver = deliver or self.report
        self._agenda: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.gpus: dict[GpuKey, str | None] = {}  # every GPU -> the batch task holding it
        self.prices: dict[str, float] = {}  # node -> what a GPU-second on it costs
        self.workers: dict[GpuKey, GpuWorker] = {}  # each GPU's serving queue and cache
        self.tasks: dict[str, Task] = {}  # placed and not yet ended
        self.stopping: set[str] = set()
        self.served: list[Served] = []  # in the order the GPUs took them
        self.ended: dict[str, float] = {}  # serving task -> when it ended
        self.done: dict[str, float] = {}  # workflow job -> when its last task ended
        self.evicted_by_batch = 0
        self.refused = 0  # serving tasks a GPU refused
        self._left: dict[str, int] = {}  # workflow job -> tasks not ended
        self._sent: dict[str, tuple[str, float]] = {}  # serving task -> (name, transfer ms)

    # -- time and the agenda ---------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self.now / self.per_s

    def units(self, seconds: float) -> float:
        return seconds * self.per_s

    def _ms(self, at: float) -> float:
        return at * (1000 / self.per_s)

    def _from_ms(self, ms: float) -> float:
        return ms / (1000 / self.per_s)

    def at(self, when: float, payload: object, rank: int | None = None) -> None:
        """Put ``payload`` on the agenda at ``when`` (the driver's unit)."""
        self._seq += 1
        order = self._ranks.get(type(payload), 0) if rank is None else rank
        if self._digits is not None:
            when = round(when, self._digits)
        heapq.heappush(self._agenda, (when, order, self._seq, payload))

    @property
    def made(self) -> int:
        """Entries put on the agenda so far."""
        return self._seq

    def entries(self) -> list[object]:
        """What the agenda holds, in no particular order."""
        return [payload for *_, payload in self._agenda]

    def report(self, event: Input) -> None:
        """Next on the agenda, after what is already due now."""
        self.at(self.now, event)

    def __bool__(self) -> bool:
        return bool(self._agenda)

    def next_at(self) -> tuple[float, int] | None:
        """(time, rank) of the next entry."""
        return self._agenda[0][:2] if self._agenda else None

    def pop(self) -> object:
        """The next entry; the clock moves to its time."""
        self.now, _, _, payload = heapq.heappop(self._agenda)
        return payload

    def handle(self, payload: object) -> bool:
        """Act on an entry the world made; False for any other."""
        match payload:
            case _Wake(gpu=gpu):
                self._wake(gpu)
            case _Finish(task_id=task_id):
                self._finish(task_id)
            case _End(task=task, exit_code=code):
                if self.tasks.get(task.task_id) is task:  # not ended, lost or placed anew
                    self.end(task.task_id, code)
            case _:
                return False
        return True

    # -- nodes -----------------------------------------------------------------------

    def join(self, node: NodeSpec, price: float = 1.0) -> None:
        """A node's GPUs, free (again, for a node that joins anew), each with an empty
        model cache when the world keeps them."""
        self.prices[node.node_id] = price
        for index in node.gpu_indices:
            self.gpus[(node.node_id, index)] = None
            if self._bandwidth is not None:
                memory = node.gpu_memory_gib * MB_PER_GIB
                worker = GpuWorker(memory, self._bandwidth, cache_model=self._cache_model)
                self.workers[(node.node_id, index)] = worker

    # -- batch tasks -----------------------------------------------------------------

    def claim(self, place: Place) -> Task:
        """A batch task takes its GPUs; the models cached there go first."""
        if place.task_id in self.tasks:
            raise SimulationError(f"{place.task_id}: placed while a task of that id runs")
        if place.node_id not in self.prices:
            raise SimulationError(f"{place.task_id}: placed on unknown node {place.node_id}")
        for index in place.gpu_indices:
            key = (place.node_id, index)
            if key not in self.gpus or self.gpus[key] is not None:
                raise SimulationError(
                    f"{place.task_id}: GPU {index} of {place.node_id} is not free"
                )
            worker = self.workers.get(key)
            if worker is not None and (worker.running is not None or worker.queue):
                raise SimulationError(f"{place.task_id}: GPU {key} is serving workflow tasks")
        for index in place.gpu_indices:
            key = (place.node_id, index)
            self.gpus[key] = place.task_id
            worker = self.workers.get(key)
            if worker is not None:
                for eviction in worker.evict_all(f"GPU taken by batch job {place.job_id}"):
                    self.evicted_by_batch += 1
                    node_id = NodeId(place.node_id)
                    self.report(ModelEvicted(self.now_s, node_id, index, eviction.model))
        task = self.tasks[place.task_id] = _task(place, serving=False)
        return task

    def start(self, place: Place) -> Task:
        """``claim``, and the task reports its start ``start_delay_s`` later."""
        task = self.claim(place)
        at_s = self.now_s + self.start_delay_s
        # Without a delay, exactly now: seconds and back need not give ``now`` again.
        self.at(self.units(at_s) if self.start_delay_s else self.now, _started(task, at_s))
        return task

    def end(self, task_id: str, exit_code: int = 0) -> Task:
        """A batch task ends now: its GPUs are free, and it says so."""
        task = self.release(task_id)
        self.announce_end(task, exit_code)
        return task

    def announce_end(self, task: Task, exit_code: int = 0) -> None:
        self.deliver(TaskEnded(self.now_s, task.job_id, task.task_id, task.node_id, exit_code))

    def release(self, task_id: str) -> Task:
        """A task is gone without a word (lost with its node): its GPUs are free."""
        task = self.tasks.pop(task_id)
        self.stopping.discard(task_id)
        for index in task.gpus:
            if self.gpus.get((task.node_id, index)) == task_id:
                self.gpus[(task.node_id, index)] = None
        return task

    def stop(self, task_id: str, grace_s: float = 0.0) -> bool:
        """SIGTERM: the batch task ends its grace from now (``grace``); False when it is
        not a running batch task, or is stopping already."""
        task = self.tasks.get(task_id)
        if task is None or task.serving or task_id in self.stopping:
            return False
        self.stopping.add(task_id)
        self.at(self.units(self.now_s + self.grace(grace_s)), _End(task, self.stopped_exit))
        return True

    def grace(self, asked_s: float) -> float:
        """How long a stopped task takes to end, as a node agent decides it
        (``stop_grace``) with the agents' ``stop_grace_s``."""
        return stop_grace(asked_s, self.stop_grace_s)

    def charge(self, usage: WindowedUsage, event: Input) -> None:
        """What the projector folds from a task's start and end (a serving task is not
        charged on its own: its GPU is, while serving holds it, ``charge_serving``)."""
        if isinstance(event, TaskStarted):
            task = self.tasks.get(event.task_id)
            if task is None or task.serving:
                return
            spec = task.spec
            price = self.prices.get(task.node_id, 1.0)
            usage.start(
                event.task_id,
                spec.allocation,
                len(task.gpus),
                allocated=spec.allocated,
                at=event.at,
                price=price,
            )
        elif isinstance(event, TaskEnded):
            usage.end(event.task_id, event.at)

    def charge_serving(self, usage: WindowedUsage, change: ServingHeld | ServingReleased) -> None:
        """What the projector folds from placement's word that serving holds a GPU (from
        now on, to an allocation) or gave it back."""
        gpu = (change.node_id, change.gpu_index)
        if isinstance(change, ServingHeld):
            price = self.prices.get(change.node_id, 1.0)
            usage.hold(gpu, change.allocation, at=self.now_s, price=price)
        else:
            usage.release(gpu, self.now_s)

    # -- serving tasks ---------------------------------------------------------------

    def send(self, place: Place) -> None:
        """A serving task joins its GPU's queue once its inputs are there, unless the
        GPU refuses it (``TaskRefused``, at once): then it is not here at all."""
        serving = place.serving
        if serving is None or len(place.gpu_indices) != 1:
            raise SimulationError(f"{place.task_id}: a serving task on {place.gpu_indices}")
        key = (place.node_id, place.gpu_indices[0])
        now_ms = self._ms(self.now)
        worker = self.workers[key]
        wait = worker.refuses(serving, now_ms)
        if wait is not None:
            self.refused += 1
            ids = JobId(place.job_id), TaskId(place.task_id), NodeId(place.node_id)
            self.deliver(TaskRefused(self.now_s, *ids, key[1], wait))
            return
        ready = now_ms + max(serving.input_delay_ms, 0.0)
        if not worker.enqueue(place.task_id, serving, ready):
            raise SimulationError(f"{place.task_id} sent twice to {key}")
        self.tasks[place.task_id] = _task(place, serving=True)
        self._sent[place.task_id] = (serving.name, ready - now_ms)
        if place.job_id not in self._left and place.spec.workflow is not None:
            self._left[place.job_id] = len(place.spec.workflow.tasks)
        if ready > now_ms:
            self._wake_at(ready, key)
        else:
            self._wake(key)

    def _wake(self, key: GpuKey) -> None:
        now_ms = self._ms(self.now)
        begun = self.workers[key].start(now_ms)
        if begun is None:
            return
        if self.gpus.get(key) is not None:
            raise SimulationError(f"{begun.task_id} started on {key}, which batch holds")
        task = self.tasks[begun.task_id]
        name, transfer_ms = self._sent.pop(begun.task_id)
        self.served.append(Served(task, name, transfer_ms, now_ms, begun))
        node_id, index = NodeId(key[0]), key[1]
        for eviction in begun.evicted:
            self.deliver(ModelEvicted(self.now_s, node_id, index, eviction.model))
        serving = begun.serving
        start = self._from_ms(begun.start_ms)
        if begun.loaded:
            model = serving.model
            self.at(
                start, ModelLoaded(begun.start_ms / 1000, node_id, index, model, serving.model_mb)
            )
        self.at(start, _started(task, begun.start_ms / 1000))
        self.at(self._from_ms(begun.finish_ms), _Finish(begun.task_id))

    def _finish(self, task_id: str) -> None:
        task = self.tasks.pop(task_id)
        key = (task.node_id, task.gpus[0])
        worker = self.workers[key]
        worker.finish(task_id)
        self.ended[task_id] = self.now
        left = self._left.get(task.job_id)
        if left is not None:
            self._left[task.job_id] = left - 1
            if left == 1:
                self.done[task.job_id] = self.now
        self.deliver(TaskEnded(self.now_s, task.job_id, task.task_id, task.node_id))
        self._wake(key)
        if worker.idle and worker.queue:
            wake_at = worker.next_ready_ms(self._ms(self.now))
            if wake_at is not None:
                self._wake_at(wake_at, key)

    def _wake_at(self, ready_ms: float, key: GpuKey) -> None:
        """The GPU looks for work when a task's inputs are there: no earlier, where agenda
        times are rounded."""
        if self._digits is None:
            self.at(self._from_ms(ready_ms), _Wake(key))
        else:
            grid = 10**self._digits
            self.at(math.ceil(ready_ms * (self.per_s * grid / 1000)) / grid, _Wake(key))


def usage_snapshot(usage: WindowedUsage, at: float, window_s: float) -> UsageSnapshot:
    """What the projector appends: each allocation's charged GPU-seconds in the window."""
    charged = tuple((name, u.allocated_gpu_s) for name, u in usage.snapshot(at).items())
    return UsageSnapshot(at, window_s, charged)


def _task(place: Place, *, serving: bool) -> Task:
    ids = JobId(place.job_id), TaskId(place.task_id), NodeId(place.node_id)
    return Task(*ids, place.gpu_indices, place.spec, serving)


def _started(task: Task, at_s: float) -> TaskStarted:
    return TaskStarted(at_s, task.job_id, task.task_id, task.node_id)
