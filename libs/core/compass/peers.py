"""Other planners' work in this planner's GPU queues (several planners: each reads the
others' ``PeerPlanned`` and ``PeerPlaced`` off the log): a peer's task holds its place
in its GPU's queue, planned or sent, till it ends or its planner drops it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from libs.core.compass.backlog import Backlogs
from libs.core.compass.gpu import Gpu, GpuKey
from libs.core.compass.timeline import Pending
from libs.core.compass.touch import GpuTouch
from libs.core.ids import JobId, TaskId
from libs.core.inputs import PeerPlaced, PeerPlanned
from libs.core.state import State, Table


class Peer(NamedTuple):
    """Another planner's task in this one's GPU queues: where, and whose."""

    gpu: GpuKey
    job_id: JobId


class Peers:
    """The peers' tasks (``tasks``: declared state), over serving's GPUs and queues;
    ``touch`` folds a GPU's change into the digest, as serving's own changes are."""

    def __init__(
        self,
        state: State,
        gpus: Table[GpuKey, Gpu],
        backlogs: Backlogs,
        touch: GpuTouch,
    ) -> None:
        self.tasks: Table[TaskId, Peer] = state.table("serving.peers")
        self._gpus = gpus
        self._backlogs = backlogs
        self._touch = touch

    def placed(self, event: PeerPlaced, now_ms: float, own: Callable[[TaskId], bool]) -> None:
        """Another planner sent a task to a GPU: it is in that GPU's queue, here too,
        and no longer where the peer's plan had it. One it knows as sent already, or
        has no GPU for, changes nothing (the scheduler refuses one of its own jobs')."""
        task = event.task
        task_id = TaskId(task.task_id)
        gpu = self._gpus.get((task.node_id, task.gpu_index))
        if gpu is None or own(task_id):
            return
        if task_id in self.tasks and not self.unplan(task_id, now_ms):
            return  # sent already
        self.tasks[task_id] = Peer(gpu.key, JobId(event.job_id))
        self._backlogs.items[task_id] = Pending(
            task.model, task.model_mb, task.run_ms, task.ready_ms, sent=True
        )
        gpu.send(task_id, task.ready_ms)
        self._touch(gpu)

    def planned(self, event: PeerPlanned, own: Callable[[TaskId], bool]) -> None:
        """Another planner planned a workflow: its tasks not yet sent hold their places
        in their GPUs' queues here, as this planner's own planned tasks do, so that
        its plans do not count on GPUs a peer has already promised. A task it knows,
        or has no GPU for, is left out (a second word of the plan changes nothing)."""
        job_id = JobId(event.job_id)
        for task in event.tasks:
            task_id = TaskId(task.task_id)
            gpu = self._gpus.get((task.node_id, task.gpu_index))
            if gpu is None or task_id in self.tasks or own(task_id):
                continue
            self.tasks[task_id] = Peer(gpu.key, job_id)
            self._backlogs.items[task_id] = Pending(
                task.model, task.model_mb, task.run_ms, task.ready_ms, sent=False
            )
            gpu.plan(task_id, task.model, task.ready_ms)
            self._touch(gpu)

    def unplan(self, task_id: TaskId, now_ms: float) -> bool:
        """A peer's task leaves the GPU its plan had it on (it was sent, or dropped);
        False if it was not planned there (it was sent already)."""
        gpu = self._gpus[self.tasks[task_id].gpu]
        if task_id not in gpu.planned:
            return False
        gpu.unplan(task_id, self._backlogs.items[task_id].model)
        self._touch(gpu, now_ms)
        return True

    def drop_plan(self, job_id: JobId, now_ms: float) -> None:
        """The peer gave up on its workflow: the tasks it planned and never sent go
        (a scan of the peers' tasks, on a failure, a loss or a cancel only)."""
        unsent = [
            task_id
            for task_id, peer in self.tasks.items()
            if peer.job_id == job_id and task_id in self._gpus[peer.gpu].planned
        ]
        for task_id in unsent:
            self.drop(task_id, now_ms)

    def drop(self, task_id: TaskId, now_ms: float) -> None:
        """A peer's task ended, or will never be sent: it leaves its GPU's queue."""
        self.unplan(task_id, now_ms)
        gpu = self._gpus[self.tasks[task_id].gpu]
        del self.tasks[task_id]
        self._backlogs.items.pop(task_id)
        gpu.dispatched.pop(task_id, None)
        gpu.started.pop(task_id, None)
        self._touch(gpu, now_ms)
