"""One GPU as workflow serving sees it: its model cache, as its node agent
reports it, and its queue: the tasks planned on it, sent to it and started there.

Its fact in the digest is kept written out in parts, one per queued task (the
task id and when its inputs arrive), so that writing it costs a join, not a
pass over the tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.core.ids import NodeId, TaskId

# (node id, GPU index)
GpuKey = tuple[NodeId, int]


def node_of(key: GpuKey) -> NodeId:
    """The node the GPU is on."""
    return key[0]


@dataclass
class Gpu:
    """One GPU as serving sees it.

    ``planned`` and ``dispatched`` map task ids, in the order they came, to their
    part of the GPU's fact: ``(task id, when its inputs arrive)``.
    """

    key: GpuKey
    memory_mb: float
    resident: dict[str, float] = field(default_factory=dict)  # model -> MB, as reported
    planned: dict[TaskId, str] = field(default_factory=dict)  # planned here, not sent yet
    dispatched: dict[TaskId, str] = field(default_factory=dict)  # sent, not yet ended
    started: dict[TaskId, float] = field(default_factory=dict)  # task id -> start (ms)
    planned_models: Counter[str] = field(default_factory=Counter)  # of the planned tasks
    # Dispatched tasks whose part is written again at the GPU's next touch: the time
    # their inputs arrive became known just after their send touched the GPU.
    restated: set[TaskId] = field(default_factory=set)

    @property
    def busy(self) -> bool:
        return bool(self.planned or self.dispatched)

    @property
    def label(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    def plan(self, task_id: TaskId, model: str, ready_ms: float) -> None:
        self.planned[task_id] = _part(task_id, ready_ms)
        if model:
            self.planned_models[model] += 1

    def unplan(self, task_id: TaskId, model: str) -> None:
        if self.planned.pop(task_id, None) is not None and model:
            self.planned_models[model] -= 1
            if not self.planned_models[model]:
                del self.planned_models[model]

    def send(self, task_id: TaskId, ready_ms: float | None) -> None:
        self.dispatched[task_id] = _part(task_id, ready_ms)

    def restate(self, ready_ms: Callable[[TaskId], float | None]) -> None:
        """Write the parts of the ``restated`` tasks again, with when their inputs arrive."""
        for task_id in self.restated:
            if task_id in self.dispatched:
                self.dispatched[task_id] = _part(task_id, ready_ms(task_id))
        self.restated.clear()

    def fact(self) -> str:
        return (
            f"{self.memory_mb}|{list(self.resident.items())}"
            f"|[{', '.join(self.planned.values())}]|[{', '.join(self.dispatched.values())}]"
            f"|{sorted(self.started.items())}"
        )


def _part(task_id: TaskId, ready_ms: float | None) -> str:
    return repr((task_id, ready_ms))
