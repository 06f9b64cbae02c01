"""A planned workflow: where each of its tasks runs and how far it got.

Its fact in the digest names every task; the parts are kept written out in
task-name order, so that writing the fact after each change costs a join, not
a sort of the whole workflow.
"""

from __future__ import annotations

from libs.core.compass.gpu import GpuKey
from libs.core.compass.workflow import Workflow
from libs.core.ids import JobId
from libs.core.model import JobSpec


class Flow:
    """One workflow job under way. Its tasks go by their names in the workflow."""

    def __init__(self, job_id: JobId, spec: JobSpec, workflow: Workflow, gpu: dict[str, GpuKey]):
        self.job_id = job_id
        self.spec = spec
        self.workflow = workflow
        self.gpu = gpu  # task name -> its GPU: planned, then where it was sent (see move)
        self.parents_left = {t.task_id: len(t.parents) for t in workflow.tasks}
        self.finished: dict[str, float] = {}  # task name -> end (ms)
        self.dispatched: set[str] = set()
        self.in_flight: dict[str, None] = {}  # sent to a GPU, not ended
        self.ended = False  # failed or cancelled: nothing more is sent
        self.abandoned: tuple[GpuKey, ...] = ()  # the GPUs its unsent tasks were planned on
        names = sorted(gpu)
        self._index = {name: i for i, name in enumerate(names)}
        self._gpu_parts = [repr((name, gpu[name])) for name in names]
        self._finished_parts: list[str | None] = [None] * len(names)
        self._dispatched_parts: list[str | None] = [None] * len(names)

    def move(self, name: str, key: GpuKey) -> None:
        self.gpu[name] = key
        self._gpu_parts[self._index[name]] = repr((name, key))

    def dispatch(self, name: str) -> None:
        self.dispatched.add(name)
        self.in_flight[name] = None
        self._dispatched_parts[self._index[name]] = repr(name)

    def recall(self, name: str) -> None:
        """A sent task is back, unsent (its GPU refused it): it is sent again at once."""
        self.dispatched.discard(name)
        self.in_flight.pop(name, None)
        self._dispatched_parts[self._index[name]] = None

    def finish(self, name: str, at_ms: float) -> None:
        self.finished[name] = at_ms
        self.in_flight.pop(name, None)
        self._finished_parts[self._index[name]] = repr((name, at_ms))

    @property
    def done(self) -> bool:
        """Nothing more will happen: every task ended, or it was given up with none left running."""
        return len(self.finished) == len(self.workflow.tasks) or (self.ended and not self.in_flight)

    def describe(self, mode: str) -> str:
        """What it is doing, for ``qm why`` (``mode``: the plan's)."""
        parts = [f"workflow {self.workflow.name} ({mode} plan)"]
        parts.append(f"{len(self.finished)} of {len(self.workflow.tasks)} tasks done")
        for task in self.workflow.tasks:
            if task.task_id in self.finished:
                continue
            state = "sent to" if task.task_id in self.dispatched else "planned on"
            node_id, index = self.gpu[task.task_id]
            parts.append(f"{task.task_id} {state} {node_id} GPU {index}")
        return "; ".join(parts)

    def fact(self) -> str:
        """``f|job|sorted(gpu.items())|sorted(finished.items())|sorted(dispatched)|ended``."""
        return (
            f"f|{self.job_id}|[{', '.join(self._gpu_parts)}]"
            f"|[{', '.join(filter(None, self._finished_parts))}]"
            f"|[{', '.join(filter(None, self._dispatched_parts))}]|{self.ended}"
        )
