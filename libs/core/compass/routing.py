"""Sending a ready workflow task (``send``): where it goes, and how long it may wait
there. The plan's GPU, unless compass (or jit) finds it stale when the task is sent and
``Planner.adjust`` moves it (``adjust``), or the GPU refused it and it goes where it
starts first (``leave``); in compass mode it goes with a wait limit (``wait_limit``),
past which its GPU refuses it. Holds no state of its own: it reads and changes
serving's tables, and folds each GPU it changes into the digest (``touch``).
"""

from __future__ import annotations

from libs.core.compass.backlog import Backlogs
from libs.core.compass.flow import Flow
from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.planner import Input, PlanMode, Planner
from libs.core.compass.pool import Pool
from libs.core.compass.timeline import GpuState, Pending, Timeline
from libs.core.compass.touch import GpuTouch
from libs.core.compass.worker import Ahead, queue_wait
from libs.core.compass.workflow import Costs, Task, Workflow
from libs.core.config import PolicyConfig
from libs.core.decisions import Decision, Place, ServingTask
from libs.core.ids import TaskId, workflow_task_id
from libs.core.inputs import TaskRefused
from libs.core.model import JobSpec
from libs.core.state import Table

# A task refused this often is sent without a wait limit: it goes somewhere at last.
MAX_REFUSALS = 3


class Router:
    """The choices of where a task is sent, over serving's GPUs (``gpus``), their queues
    (``backlogs``), the GPUs a plan may use (``pool``) and the refusals so far."""

    def __init__(
        self,
        config: PolicyConfig,
        mode: PlanMode,
        costs: Costs,
        planner: Planner,
        gpus: Table[GpuKey, Gpu],
        pool: Pool,
        backlogs: Backlogs,
        refusals: Table[TaskId, int],
        touch: GpuTouch,
    ) -> None:
        self.config = config
        self.mode = mode
        self._costs = costs
        self._planner = planner
        self._gpus = gpus
        self._pool = pool
        self._backlogs = backlogs
        self._refusals = refusals
        self._touch = touch

    def acquire(self, gpu: Gpu, allocation: str) -> list[Decision]:
        """A plan uses the GPU: serving holds it, charged to the plan's allocation."""
        taken = self._pool.take(gpu.key, allocation)
        self._touch(gpu)
        return list(taken)

    def send(
        self, flow: Flow, task: Task, now_ms: float, refused: TaskRefused | None = None
    ) -> list[Decision]:
        """Send a ready task to its GPU, adjusting first when the plan went stale (or
        elsewhere, when that GPU ``refused`` it), with the wait it may take there."""
        task_id = workflow_task_id(flow.job_id, task.task_id)
        planned = self._gpus[flow.gpu[task.task_id]]
        planned.unplan(task_id, task.model)
        if refused is None:
            target, reason = self.adjust(flow, task, planned, now_ms)
        else:
            target, reason = self.leave(flow, task, planned, refused, now_ms)
        limit = self.wait_limit(task_id, task, target, flow, now_ms)
        kept = self._backlogs.kept(now_ms, planned.key, target.key)
        self._touch(planned, now_ms)
        decisions: list[Decision] = []
        if target is not planned:
            flow.move(task.task_id, target.key)
            decisions += self.acquire(target, flow.spec.allocation)
        target.send(task_id, self._backlogs.ready(task_id))
        self._touch(target)
        target.restated.add(task_id)  # its arrival, set below, shows from the next touch
        flow.dispatch(task.task_id)
        arrival = self.arrival(flow, task, target, now_ms)
        item = Pending(task.model, task.model_mb, task.run_ms, arrival, sent=True)
        self._backlogs.sent(task_id, item, kept, target.key)
        serving = ServingTask(
            task.task_id,
            task.model,
            task.model_mb,
            task.run_ms,
            max(0.0, arrival - now_ms),
            self._backlogs.upcoming(target),
            planned.key if target is not planned else None,
            reason,
            limit,
        )
        decisions.append(
            Place(flow.job_id, task_id, target.key[0], (target.key[1],), flow.spec, serving)
        )
        return decisions

    def views(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float
    ) -> dict[GpuKey, GpuState]:
        """The GPUs a plan may use (``Pool.candidates``), as the planner sees them."""
        return {
            key: self._backlogs.view(self._gpus[key], now_ms)
            for key in self.candidates(spec, workflow, need_mb, now_ms)
        }

    def candidates(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float
    ) -> list[GpuKey]:
        return self._pool.candidates(spec, workflow, need_mb, now_ms, spread=self.mode.hashed)

    def wait_limit(
        self, task_id: TaskId, task: Task, target: Gpu, flow: Flow, now_ms: float
    ) -> float | None:
        """compass: the wait this planner expects at the GPU for the task sent now, as
        its node agent will count it (``queue_wait``, over what was sent there before
        it), plus ``refuse_margin`` × its run time; None (no limit) in the other
        modes, with no margin, and for a task refused ``MAX_REFUSALS`` times."""
        if not self.limited(task_id):
            return None
        sent = self._backlogs.view(target, now_ms, sent_only=True)
        ahead = [Ahead(p.ready_ms, p.model, p.model_mb, p.run_ms) for p in sent.backlog]
        ready = max(now_ms, self.arrival(flow, task, target, now_ms))
        mb_per_ms = self._costs.host_to_gpu_mb_per_ms
        wait = queue_wait(sent.free_at_ms, sent.resident, ahead, ready, mb_per_ms)
        return wait + self.config.refuse_margin * task.run_ms

    def arrival(self, flow: Flow, task: Task, target: Gpu, now_ms: float) -> float:
        """When the task's inputs reach ``target``: the last parent's end and transfer."""
        return max(
            (
                flow.finished[p]
                + self._costs.transfer_ms(task.in_kb, flow.gpu[p][0] == target.key[0])
                for p in task.parents
            ),
            default=now_ms,
        )

    def limited(self, task_id: TaskId) -> bool:
        """Whether the task is sent with a wait limit (so it may be refused)."""
        return (
            self.mode is PlanMode.COMPASS
            and bool(self.config.refuse_margin)
            and self._refusals.get(task_id, 0) < MAX_REFUSALS
        )

    def leave(
        self, flow: Flow, task: Task, refusing: Gpu, refused: TaskRefused, now_ms: float
    ) -> tuple[Gpu, str]:
        """The GPU where the refused task would start first, other than the one that
        refused it (that one only if no other may take it)."""
        own = self._backlogs.line(refusing, now_ms).timeline
        target = self.elsewhere(flow, task, own, now_ms, 0.0, leave=True)
        if target is None:
            return refusing, ""
        return target, f"refused by {refusing.label}: {refused.wait_ms:.0f} ms of work queued there"

    def elsewhere(
        self,
        flow: Flow,
        task: Task,
        own: Timeline,
        now_ms: float,
        threshold: float,
        *,
        leave: bool = False,
    ) -> Gpu | None:
        """The GPU ``Planner.adjust`` moves the task to from ``own`` (its GPU's timeline),
        among the plan's candidates; None when it stays."""
        lines = {
            self._backlogs.line(self._gpus[key], now_ms).timeline: key
            for key in self.candidates(flow.spec, flow.workflow, task.model_mb, now_ms)
        }
        chosen = self._planner.adjust(
            task, own, list(lines), now_ms, threshold, inputs=_inputs(flow, task), leave=leave
        )
        return None if chosen is own else self._gpus[lines[chosen]]

    def adjust(self, flow: Flow, task: Task, planned: Gpu, now_ms: float) -> tuple[Gpu, str]:
        if self.mode is PlanMode.COMPASS:
            threshold = self.config.adjust_threshold
            if len(task.parents) > 1 and not self.config.adjust_joins:
                return planned, ""
        elif self.mode is PlanMode.JIT:
            threshold = 0.0
        else:
            return planned, ""
        # A task ready now waits only for what was sent before it (see Backlogs.wait).
        wait = self._backlogs.wait(planned, now_ms)
        if threshold and wait <= threshold * task.run_ms:
            return planned, ""  # the common case: no need to look at other GPUs
        own = self._backlogs.line(planned, now_ms)
        task_id = workflow_task_id(flow.job_id, task.task_id)
        self._backlogs.leave_behind(own, task_id, task, now_ms, _inputs(flow, task))
        target = self.elsewhere(flow, task, own.timeline, now_ms, threshold)
        if target is None:
            return planned, ""
        if self.mode is PlanMode.JIT:
            return target, "re-routed at run time (jit)"
        return target, (
            f"{wait:.0f} ms wait on {planned.label} exceeds {threshold:g}× its "
            f"{task.run_ms:g} ms run"
        )


def _inputs(flow: Flow, task: Task) -> list[Input]:
    """Where the task's inputs come from, and when: each parent's node and end."""
    return [Input(node_of(flow.gpu[p]), flow.finished[p]) for p in task.parents]
