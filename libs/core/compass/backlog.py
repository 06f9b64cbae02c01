"""Serving's GPU backlogs as the planner sees them, and the timelines kept for adjusting.

A GPU's backlog is the tasks sent to it or planned on it that have not
started. Each task's item (``Pending``) is what its GPU's backlog holds of it:
the plan's estimate of when its inputs arrive there, then, once it is sent,
the known time. ``view`` gives the planner a GPU with its backlog; ``line`` a
GPU's timeline for adjusting, built once per input time and then edited on
each send exactly as a rebuild would be (held to it by
test_kept_timelines_decide_as_timelines_built_afresh_for_every_send); any other
change to the GPU drops it (``touched``).
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.planner import Input, Planner
from libs.core.compass.timeline import GpuState, Pending, Timeline
from libs.core.compass.workflow import Task
from libs.core.ids import TaskId
from libs.core.limits import MAX_UPCOMING
from libs.core.state import State, Table


@dataclass
class KeptLine:
    """A GPU's timeline as of ``now_ms``, with the item of each task in it."""

    now_ms: float
    timeline: Timeline
    items: dict[TaskId, Pending]


class Backlogs:
    """The item of every task in a serving GPU's backlog (declared state), and the
    timelines kept for adjusting (``DERIVED``: a cache, see the module)."""

    DERIVED = ("_lines",)

    def __init__(self, planner: Planner, state: State) -> None:
        self._planner = planner
        # task id -> its item, as its GPU's backlog holds it (started tasks too, till
        # they end: their run tells when the GPU is free).
        self.items: Table[TaskId, Pending] = state.table("serving.items")
        self._lines: dict[GpuKey, KeptLine] = {}

    def ready(self, task_id: TaskId) -> float | None:
        """When the task's inputs arrive at its GPU, as its item says (None: no item)."""
        item = self.items.get(task_id)
        return None if item is None else item.ready_ms

    def view(self, gpu: Gpu, now_ms: float, *, sent_only: bool = False) -> GpuState:
        """The GPU as the planner sees it: when its running task ends, its models,
        and its backlog (sent, then planned) with when each task's inputs arrive."""
        backlog = tuple(item for _, item in self._backlog(gpu, sent_only))
        return self._state(gpu, now_ms, backlog)

    def upcoming(self, gpu: Gpu) -> tuple[str, ...]:
        """The models planned on the GPU, each once, in plan order (its cache's look-ahead),
        the soonest ``MAX_UPCOMING``: enough to evict by, and a bound on the record."""
        models: dict[str, None] = {}
        for task_id in gpu.planned:
            if len(models) in (len(gpu.planned_models), MAX_UPCOMING):
                break  # seen them all (the rest of the queue adds none), or enough
            model = self.items[task_id].model
            if model:
                models[model] = None
        return tuple(models)

    # -- the timelines kept for adjusting ---------------------------------------

    def line(self, gpu: Gpu, now_ms: float) -> KeptLine:
        """The GPU's timeline for adjusting, built once and then kept up to date."""
        line = self._lines.get(gpu.key)
        if line is None or line.now_ms != now_ms:
            backlog = self._backlog(gpu)
            reserve = self._planner.mode.reserves
            state = self._state(gpu, now_ms, tuple(item for _, item in backlog))
            timeline = self._planner.timeline(state, now_ms)
            items = {t: item for t, item in backlog if item.sent or reserve}
            line = self._lines[gpu.key] = KeptLine(now_ms, timeline, items)
        return line

    def kept(self, now_ms: float, *keys: GpuKey) -> dict[GpuKey, KeptLine]:
        """The timelines kept for these GPUs as of ``now_ms``."""
        return {
            key: line
            for key in keys
            if (line := self._lines.get(key)) is not None and line.now_ms == now_ms
        }

    def wait(self, gpu: Gpu, now_ms: float) -> float:
        """How long a task ready now would wait for the GPU: only for what was sent
        before it (the planned tasks, itself among them, go after it). A kept
        timeline answers, or those alone."""
        kept = self.kept(now_ms, gpu.key).get(gpu.key)
        if kept is not None:
            return kept.timeline.wait(now_ms)
        return self._planner.wait_ms(self.view(gpu, now_ms, sent_only=True), now_ms)

    def leave_behind(
        self, own: KeptLine, task_id: TaskId, task: Task, now_ms: float, inputs: list[Input]
    ) -> None:
        """Weigh the planned GPU without the task (its item is still in the kept
        timeline, to be moved there in one edit if it stays): only an item ahead of
        the task's own turn makes a difference, and is taken out now."""
        item = own.items.get(task_id)
        if item is None:
            return
        ready = self._planner.ready_at(task, own.timeline.node_id, now_ms, inputs)
        at = own.timeline.find(item)
        if at < own.timeline.slot(ready):
            own.timeline.replace(at, None)
            del own.items[task_id]

    def sent(
        self, task_id: TaskId, item: Pending, kept: dict[GpuKey, KeptLine], target: GpuKey
    ) -> None:
        """The task was sent to ``target``, where ``item`` is its place now; the kept
        timelines (the send's touches dropped them) follow it."""
        self.items[task_id] = item
        for key, line in kept.items():
            left = line.items.pop(task_id, None)
            sent = None
            if key == target:
                sent = line.items[task_id] = item
            line.timeline.replace(None if left is None else line.timeline.find(left), sent)
            self._lines[key] = line

    def touched(self, gpu: Gpu) -> None:
        """The GPU changed: its sent tasks show when their inputs arrive, and its
        kept timeline goes."""
        gpu.restate(self.ready)
        self._lines.pop(gpu.key, None)

    # -- inside ------------------------------------------------------------------

    def _state(self, gpu: Gpu, now_ms: float, backlog: tuple[Pending, ...]) -> GpuState:
        free_at = now_ms
        for task_id, start in gpu.started.items():
            free_at = max(free_at, start + self.items[task_id].run_ms)
        return GpuState(
            gpu.label, node_of(gpu.key), free_at, dict(gpu.resident), gpu.memory_mb, backlog
        )

    def _backlog(self, gpu: Gpu, sent_only: bool = False) -> list[tuple[TaskId, Pending]]:
        """The tasks waiting for the GPU, sent then planned, each with its item."""
        ids = gpu.dispatched.keys() if sent_only else (*gpu.dispatched, *gpu.planned)
        return [(t, self.items[t]) for t in ids if t not in gpu.started]
