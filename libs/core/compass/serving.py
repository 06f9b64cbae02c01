"""The workflow scheduler inside the core: plan on arrival, dispatch when ready, adjust.

A workflow job is planned whole when it arrives (``planner.Planner``): every
task gets a GPU and an estimated start. A task is sent to its GPU (a ``Place``
carrying a ``ServingTask``) only when its inputs are ready: roots at once, the
others when their last parent ends. At that moment ``compass`` may adjust: if
the planned GPU's queue would keep the task waiting longer than
``adjust_threshold`` × its run time, it goes where wait plus load is lowest;
``jit`` always re-routes; ``heft`` and ``hash`` keep the plan.

Under overload ``compass`` also holds new workflows back: while a plan would
keep a workflow's first task waiting longer than ``hold_threshold`` × its
best-case time, it stays in the scheduler's queue (per GPU type). The tasks of
workflows already under way then meet short GPU queues instead of queueing behind
the roots of every newer workflow, which at 2.5× overload cuts the median slowdown
by a third. The queue goes earliest due first, due being arrival + ``due_slack``
× best case: a short workflow goes before a long one that can wait longer, and a
long one before short ones that arrived more than ``due_slack`` × the difference
later. Most workflows are short, so this is what keeps the median slowdown low
under overload: at 2× overload (20 GPUs, FIFO caches, reports 10 ms late) due
times at 30 × the best case rather than 3 × took the median from 20 to 8.9, and
holding from 0.75 × rather than 3 × to 3.2 (medians over seeds 1-3, then 1-5).
When workflows bring more work than the GPUs run, the ones with the most work
also wait, till they are due (``load``): in that setting the median went from
3.16 to 1.21 at 20 GPUs and from 2.50 to 1.22 at 40, where the work offered is
the cluster's (seeds 1-5).

Serving shares the cluster with batch work through its pool (``pool``): the
GPUs it holds from batch work. Waiting workflows go before every batch tier
when GPUs free up: they are the latency-sensitive fast path.

The GPU's memory is a model cache kept by its node agent; ``ModelLoaded`` and
``ModelEvicted`` inputs keep this view of it current (``gpu``). All times here
are ms on the input clock. What serving remembers is declared in tables of the
scheduler's ``State`` (prefixed ``serving.``), so its digest covers them.
"""

from __future__ import annotations

import enum

from libs.core.compass.backlog import Backlogs
from libs.core.compass.flow import Flow
from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.load import Load, Work
from libs.core.compass.order import GpuOrder
from libs.core.compass.peers import Peers
from libs.core.compass.planner import Assignment, PlanMode, Planner
from libs.core.compass.pool import BatchGpus, Pool, PoolChange, Want
from libs.core.compass.routing import Router
from libs.core.compass.timeline import Pending
from libs.core.compass.touch import GpuTouch
from libs.core.compass.workflow import BYTES_PER_MB, CacheModel, Costs, Task, Workflow
from libs.core.config import PolicyConfig
from libs.core.decisions import (
    Cancel,
    Decision,
    JobLost,
    Planned,
    PlannedTask,
    Stop,
    StopCause,
    TaskLost,
    Wait,
)
from libs.core.ids import JobId, NodeId, TaskId, workflow_task_id
from libs.core.inputs import PeerArrived, PeerPlaced, PeerPlanned, TaskRefused
from libs.core.model import JobSpec, NodeSpec
from libs.core.state import State, Table
from libs.core.wait_reasons import WaitCode, WaitReason

__all__ = ["MB_PER_GIB", "BatchGpus", "GpuKey", "Serving"]

MB_PER_GIB = (1 << 30) / BYTES_PER_MB  # node memory is in GiB


class _NotPlanned(enum.Enum):
    NO_GPU = enum.auto()  # none may take it now
    HELD = enum.auto()  # a plan would start it too late: see _holds


class Serving:
    """Workflow serving. What it remembers is declared in ``state``, its own tables
    and those of its parts (``pool``, ``_backlogs``); every other attribute is config
    or a cache derived from declared state (``DERIVED``, rebuilt by ``derived``).

    Ids come in as the inputs carry them, plain strs; each entry point names them
    (``JobId``, ``TaskId``) once.
    """

    DERIVED = ("_tasks",)

    def __init__(self, config: PolicyConfig, state: State, gpus: BatchGpus) -> None:
        self.config = config
        self.mode = PlanMode(config.serving_mode)
        self._costs = Costs(
            config.host_to_gpu_mb_per_ms,
            config.node_to_node_mb_per_ms,
            0.0,
            CacheModel(config.serving_cache_model),
        )
        self._planner = Planner(self._costs, self.mode, GpuOrder(config.serving_planner))
        self._batch = gpus
        self._gpus: Table[GpuKey, Gpu] = state.table("serving.gpus", Gpu.fact)
        self.pool = Pool(config, state, gpus, self._gpus)  # the GPUs held from batch work
        self._flows: Table[JobId, Flow] = state.table("serving.flows", Flow.fact)
        self._backlogs = Backlogs(self._planner, state)
        self._touch = GpuTouch(self.pool, self._backlogs, self._gpus)
        # Workflows no GPU could take, in order.
        self.waiting: Table[JobId, JobSpec] = state.table("serving.waiting")
        # compass plans waiting workflows earliest due first: arrival + due_slack × best
        # case, so short workflows go before long ones that can wait longer.
        self._due: Table[JobId, float] = state.table("serving.due")
        # The work that arrived and was admitted lately: under overload the workflows
        # with the most work wait (``load``).
        self._load = Load(state, config.arrival_window_s * 1000, config.admit_window_s * 1000)
        # Other planners' tasks in this one's GPU queues, planned (``PeerPlanned``) or
        # sent (``PeerPlaced``), till they end.
        self.peers = Peers(state, self._gpus, self._backlogs, self._touch)
        # This planner's tasks that GPUs refused, and how often, till they end.
        self._refusals: Table[TaskId, int] = state.table("serving.refusals")
        self._router = Router(
            config,
            self.mode,
            self._costs,
            self._planner,
            self._gpus,
            self.pool,
            self._backlogs,
            self._refusals,
            self._touch,
        )
        # Derived (see ``derived``): task id -> (job id, task), in flight.
        self._tasks: dict[TaskId, tuple[JobId, Task]] = {}

    def derived(self) -> dict[str, object]:
        """``_tasks`` rebuilt from the flows: their tasks not yet ended, but for the
        unsent ones of an abandoned flow."""
        tasks = {
            workflow_task_id(flow.job_id, task.task_id): (flow.job_id, task)
            for flow in self._flows.values()
            for task in flow.workflow.tasks
            if task.task_id not in flow.finished
            and (not flow.ended or task.task_id in flow.dispatched)
        }
        return {"_tasks": tasks}

    # -- facts from the log --------------------------------------------------

    def add_node(self, node: NodeSpec) -> None:
        for index in node.gpu_indices:
            key = (node.node_id, index)
            gpu = self._gpus.setdefault(key, Gpu(key, 0.0))
            gpu.memory_mb = node.gpu_memory_gib * MB_PER_GIB
            self._touch(gpu)

    def owns(self, task_id: TaskId, node_id: NodeId) -> bool:
        """Whether the task is a workflow task sent to (or planned on) ``node_id``, by
        this planner or a peer; a report from any other node is not believed."""
        peer = self.peers.tasks.get(task_id)
        if peer is not None:
            return node_of(peer.gpu) == node_id
        known = self._tasks.get(task_id)
        return known is not None and self._flows[known[0]].gpu[known[1].task_id][0] == node_id

    def peer_placed(self, event: PeerPlaced, now_ms: float) -> None:
        """Another planner sent a task (``Peers.placed``)."""
        self.peers.placed(event, now_ms, own=self._tasks.__contains__)

    def peer_planned(self, event: PeerPlanned) -> None:
        """Another planner planned a workflow (``Peers.planned``)."""
        self.peers.planned(event, own=self._tasks.__contains__)

    def peer_arrived(self, event: PeerArrived, now_ms: float) -> None:
        """A workflow arrived at another planner: its work counts in the load."""
        if self._shedding:
            self._load.peer_arrived(event.job_id, Work(now_ms, event.gpu_type, event.work_ms))

    def loaded(self, node_id: NodeId, gpu_index: int, model: str, size_mb: float) -> None:
        gpu = self._gpus.get((node_id, gpu_index))
        if gpu is not None:
            gpu.resident[model] = size_mb
            self._touch(gpu)

    def evicted(self, node_id: NodeId, gpu_index: int, model: str) -> None:
        gpu = self._gpus.get((node_id, gpu_index))
        if gpu is not None and gpu.resident.pop(model, None) is not None:
            self._touch(gpu)

    def _gpu_of(self, task_id: TaskId) -> Gpu | None:
        """The GPU a known task (a peer's or this planner's) is planned on or sent to."""
        peer = self.peers.tasks.get(task_id)
        if peer is not None:
            return self._gpus[peer.gpu]
        known = self._tasks.get(task_id)
        if known is None:
            return None
        job_id, task = known
        return self._gpus[self._flows[job_id].gpu[task.task_id]]

    def started(self, task_id: TaskId, now_ms: float) -> None:
        gpu = self._gpu_of(task_id)
        assert gpu is not None  # a report the scheduler believed (``owns``)
        if task_id in gpu.dispatched:
            gpu.started[task_id] = now_ms
            model = self._backlogs.items[task_id].model
            if model in gpu.resident and self._costs.cache_model is CacheModel.LOOKAHEAD:
                # Most recently used now, as the agent's cache orders it (FIFO's keeps
                # the order models were loaded in).
                gpu.resident[model] = gpu.resident.pop(model)
            self._touch(gpu)

    def ended(self, task_id: TaskId, exit_code: int, now_ms: float) -> list[Decision]:
        """A task ended: send the successors it unblocked, or give up on a failed flow
        (a peer's task only leaves its GPU's queue: its successors are the peer's)."""
        peer = self.peers.tasks.get(task_id)
        if peer is not None:
            self.peers.drop(task_id, now_ms)
            if exit_code != 0:  # its planner abandons the workflow
                self.peers.drop_plan(peer.job_id, now_ms)
            return []
        job_id, task = self._tasks.pop(task_id)
        self._backlogs.items.pop(task_id)
        self._refusals.pop(task_id)
        flow = self._flows[job_id]
        gpu = self._gpus[flow.gpu[task.task_id]]
        gpu.dispatched.pop(task_id, None)
        gpu.started.pop(task_id, None)
        self._touch(gpu, now_ms)
        flow.finish(task.task_id, now_ms)
        decisions: list[Decision] = []
        if exit_code != 0:
            self._abandon(flow, now_ms)
        elif not flow.ended:
            for child in flow.workflow.children(task.task_id):
                flow.parents_left[child] -= 1
                if flow.parents_left[child] == 0:
                    decisions += self._router.send(flow, flow.workflow.task(child), now_ms)
        self._touch_flow(flow)
        if flow.done:
            self._forget(flow)
        return decisions

    def refused(self, event: TaskRefused, now_ms: float) -> list[Decision] | None:
        """A GPU refused a task: the work queued there would have kept it waiting past
        its limit. A peer's leaves that GPU's queue here (its planner sends it on);
        this planner's own goes where it would start first, another GPU (``_send``).
        One of a workflow given up on is done with. None: no such task was sent to
        that GPU with a wait limit (or it started there), and nothing changes."""
        task_id = TaskId(event.task_id)
        gpu = self._gpu_of(task_id)
        if (
            gpu is None
            or gpu.key != (NodeId(event.node_id), event.gpu_index)
            or task_id not in gpu.dispatched
            or task_id in gpu.started
        ):
            return None
        if task_id in self.peers.tasks:  # its planner knows whether it had a limit
            self.peers.drop(task_id, now_ms)
            return []
        if not self._router.limited(task_id):
            return None
        job_id, task = self._tasks[task_id]
        flow = self._flows[job_id]
        if flow.ended:  # never to run: it is over, as if it had ended
            return self.ended(task_id, 0, now_ms)
        gpu.dispatched.pop(task_id)
        flow.recall(task.task_id)
        self._touch(gpu, now_ms)
        self._touch_flow(flow)
        self._refusals[task_id] = self._refusals.get(task_id, 0) + 1
        return self._router.send(flow, task, now_ms, refused=event)

    # -- decisions -----------------------------------------------------------

    def arrive(self, job_id: JobId, spec: JobSpec, now_ms: float) -> list[Decision]:
        self.waiting[job_id] = spec
        if self._holding:
            assert spec.workflow is not None
            self._due[job_id] = now_ms + self.config.due_slack * self._best_ms(spec.workflow)
        if self._shedding:
            self._load.arrive(job_id, _work(spec, now_ms))
        decisions = self.retry(now_ms)  # those due first first
        if job_id in self.waiting:
            decisions.append(Wait(job_id, self._why_waiting(job_id, spec, now_ms)))
        return decisions

    def retry(self, now_ms: float) -> list[Decision]:
        """Plan waiting workflows in turn (``_in_turn``); one no GPU can hold does not
        block the rest, one held back holds back those after it of its GPU type."""
        decisions: list[Decision] = []
        held: set[str] = set()
        for job_id in self._in_turn():
            spec = self.waiting[job_id]
            if not self.pool.usable:
                self.pool.want(_want(spec))  # none serves, none is free: the pool must grow
                break
            if spec.gpu_type in held:
                continue
            planned = (
                _NotPlanned.HELD
                if self._sheds(job_id, spec, now_ms)
                else self._plan(job_id, spec, now_ms)
            )
            if planned is _NotPlanned.HELD:
                held.add(spec.gpu_type)
            elif planned is not _NotPlanned.NO_GPU:
                del self.waiting[job_id]
                self._due.pop(job_id)
                if self._shedding:
                    self._load.admit(job_id, _work(spec, now_ms))
                decisions += planned
        return decisions

    @property
    def _holding(self) -> bool:
        return self.mode is PlanMode.COMPASS and bool(self.config.hold_threshold)

    @property
    def _shedding(self) -> bool:
        return self._holding and bool(self.config.admit_load)

    def _sheds(self, job_id: JobId, spec: JobSpec, now_ms: float) -> bool:
        """compass under overload: the workflow waits for the load to fall (``load``),
        till its due time at the latest, and only while a workflow of this planner's
        is in flight (its tasks' ends retry the ones waiting)."""
        if not (self._shedding and self._flows) or now_ms >= self._due[job_id]:
            return False
        gpus = min(self.pool.cap, sum(self._batch.schedulable(spec).values()))
        return self._load.sheds(job_id, _work(spec, now_ms), gpus, self.config.admit_load)

    def _why_waiting(self, job_id: JobId, spec: JobSpec, now_ms: float) -> WaitReason:
        if self._sheds(job_id, spec, now_ms):
            return WaitReason.of(WaitCode.WORKFLOWS_SHED, admit_load=f"{self.config.admit_load:g}")
        return self.pool.why_waiting(spec)

    def _in_turn(self) -> list[JobId]:
        """The waiting workflows in the order they are planned."""
        if not self._holding:
            return list(self.waiting)
        due = self._due
        return sorted(self.waiting, key=lambda job_id: (due[job_id], job_id))

    def grow(self, now_ms: float) -> list[Decision]:
        """Take a freed GPU for a backed-up pool, before batch work can (``Pool.grow``)."""
        return self._changed(self.pool.grow(), now_ms)

    def adopt(self, keys: list[GpuKey], allocation: str, now_ms: float) -> list[Decision]:
        """Take the GPUs a job stopped for ``allocation``'s serving freed (``Pool.adopt``)."""
        return self._changed(self.pool.adopt(keys, allocation), now_ms)

    def release_idle(self, now_ms: float) -> list[Decision]:
        """Give idle GPUs back to batch work (``Pool.release_idle``)."""
        return self._changed(self.pool.release_idle(now_ms))

    def give_back(self, keys: list[GpuKey]) -> list[Decision]:
        """Give these idle GPUs back to batch work now (budget pressure)."""
        return self._changed([change for key in keys for change in self.pool.give_back(key)])

    def _changed(self, changes: list[PoolChange], now_ms: float | None = None) -> list[Decision]:
        """GPUs joined (idle: each lingers unless a plan uses it) or left the pool."""
        for change in changes:
            self._touch(self._gpus[change.node_id, change.gpu_index], now_ms)
        return list(changes)

    def lose(self, node_id: NodeId, why: str, now_ms: float) -> list[Decision]:
        """A node was lost, or its agent restarted: the tasks sent there are lost, and
        with them every workflow that sent or planned a task there (its other tasks
        under way are stopped); the node's GPUs leave the pool, their models gone."""
        keys = sorted(key for key in self._gpus if key[0] == node_id)
        hit: dict[JobId, None] = {}  # the workflows lost, in a deterministic order
        peers: dict[JobId, None] = {}  # and the peers' (their planners hear of it too)
        for key in keys:
            gpu = self._gpus[key]
            for task_id in (*gpu.dispatched, *gpu.planned):
                if (peer := self.peers.tasks.get(task_id)) is not None:
                    self.peers.drop(task_id, now_ms)
                    peers[peer.job_id] = None
                else:
                    hit[self._tasks[task_id][0]] = None
        for job_id in peers:
            self.peers.drop_plan(job_id, now_ms)
        decisions: list[Decision] = []
        for job_id in hit:
            decisions += self._lose_flow(self._flows[job_id], node_id, why, now_ms)
        for key in keys:
            decisions += self.pool.give_back(key)  # to the node's capacity: free when it returns
            gpu = self._gpus[key]
            gpu.resident.clear()
            self._touch(gpu)
        return decisions

    def _lose_flow(self, flow: Flow, node_id: NodeId, why: str, now_ms: float) -> list[Decision]:
        self._abandon(flow, now_ms)
        decisions: list[Decision] = []
        for name in sorted(flow.in_flight):
            task_id = workflow_task_id(flow.job_id, name)
            at = flow.gpu[name]
            if at[0] != node_id:
                decisions.append(Stop(flow.job_id, task_id, at[0], StopCause.NODE_LOST, why))
                continue
            decisions.append(TaskLost(flow.job_id, task_id, node_id, why))
            gpu = self._gpus[at]
            gpu.dispatched.pop(task_id, None)
            gpu.started.pop(task_id, None)
            self._tasks.pop(task_id, None)
            self._backlogs.items.pop(task_id)
            flow.finish(name, now_ms)
            self._touch(gpu, now_ms)
        decisions.append(JobLost(flow.job_id, f"{why}; a workflow does not go on without it"))
        self._touch_flow(flow)
        if flow.done:
            self._forget(flow)
        return decisions

    def cancel(self, job_id: JobId, now_ms: float) -> list[Decision] | None:
        """Withdraw a workflow; None when the job is not a workflow this knows (a
        peer's: what its planner had planned and not sent goes from the queues here)."""
        job = job_id
        self.peers.drop_plan(job, now_ms)
        if self.waiting.pop(job) is not None:
            self._due.pop(job)
            return [Cancel(job, "cancelled before it started")]
        flow = self._flows.get(job)
        if flow is None:
            return None
        if flow.ended:
            return []
        self._abandon(flow, now_ms)
        self._touch_flow(flow)
        decisions: list[Decision] = [Cancel(job, "cancelled by user")]
        for name in sorted(flow.in_flight):
            node_id, _ = flow.gpu[name]
            task_id = workflow_task_id(job, name)
            decisions.append(Stop(job, task_id, node_id, StopCause.CANCELLED, "cancelled"))
        if flow.done:
            self._forget(flow)
        return decisions

    def held_on(self, node_id: NodeId) -> set[int]:
        return self.pool.held_on(node_id)

    def allocation_of(self, job_id: JobId) -> str:
        spec = self.waiting.get(job_id)
        if spec is None:
            spec = self._flows[job_id].spec
        return spec.allocation

    def describe(self, job_id: JobId, now_ms: float) -> str | None:
        """What a workflow is doing, for ``qm why``; None when it is not one."""
        spec = self.waiting.get(job_id)
        if spec is not None:
            ahead = self._in_turn().index(job_id)
            why = self._why_waiting(job_id, spec, now_ms).words()
            return f"{why}; {ahead} workflow(s) ahead of it"
        flow = self._flows.get(job_id)
        return None if flow is None else flow.describe(self.mode.value)

    # -- planning ------------------------------------------------------------

    def _plan(self, job_id: JobId, spec: JobSpec, now_ms: float) -> list[Decision] | _NotPlanned:
        workflow = spec.workflow
        assert workflow is not None
        need_mb = workflow.largest_model_mb
        views = self._router.views(spec, workflow, need_mb, now_ms)
        if not views:
            self.pool.want(_want(spec))  # none it may use serves or is free: grow
            return _NotPlanned.NO_GPU
        plan = self._planner.plan(workflow, list(views.values()), now_ms, job_id=job_id)
        by_label = {self._gpus[key].label: key for key in views}
        if all(key in self.pool.held for key in views):
            backed_up = any(
                a.wait_ms > self.config.adjust_threshold * t.run_ms
                for a, t in zip(plan, workflow.tasks, strict=True)
                if not t.parents
            )
            if backed_up:
                self.pool.want(_want(spec))
        if self._holds(workflow, plan):
            return _NotPlanned.HELD  # the views were copies: nothing to undo
        flow = Flow(job_id, spec, workflow, gpu={a.task_id: by_label[a.gpu_id] for a in plan})
        self._flows[job_id] = flow
        taken: list[Decision] = []
        for task, assignment in zip(workflow.tasks, plan, strict=True):
            task_id = workflow_task_id(job_id, task.task_id)
            self._tasks[task_id] = (job_id, task)
            self._backlogs.items[task_id] = Pending(
                task.model, task.model_mb, task.run_ms, assignment.ready_ms, sent=False
            )
            gpu = self._gpus[flow.gpu[task.task_id]]
            gpu.plan(task_id, task.model, assignment.ready_ms)
            taken += self._router.acquire(gpu, spec.allocation)
        decisions: list[Decision] = [
            *taken,
            Planned(
                job_id,
                self.mode.value,
                tuple(
                    PlannedTask(a.task_id, *by_label[a.gpu_id], a.start_ms, a.finish_ms, a.load_ms)
                    for a in plan
                ),
            ),
        ]
        for task in workflow.tasks:
            if not task.parents:
                decisions += self._router.send(flow, task, now_ms)
        self._touch_flow(flow)
        return decisions

    def _holds(self, workflow: Workflow, plan: list[Assignment]) -> bool:
        """compass under overload: the plan would start the workflow too late to send it now."""
        hold = self.config.hold_threshold
        if self.mode is not PlanMode.COMPASS or not hold:
            return False
        # The queue ahead of its first task, not the load or eviction penalty: a
        # hold that waited for those would wait forever on a GPU that must evict.
        wait = min(a.wait_ms for a, t in zip(plan, workflow.tasks, strict=True) if not t.parents)
        return wait > hold * self._best_ms(workflow)

    def _best_ms(self, workflow: Workflow) -> float:
        """The workflow's best case: its critical path, transfers included."""
        return max(self._planner.upward_ranks(workflow).values())

    # -- bookkeeping ---------------------------------------------------------

    def _abandon(self, flow: Flow, now_ms: float) -> None:
        """Stop sending a failed or cancelled flow's tasks; planned ones are dropped.

        Again (another task failed): only the GPUs they were planned on are touched,
        as going through the dropped tasks once more would.
        """
        if flow.ended:
            for key in flow.abandoned:
                self._touch(self._gpus[key], now_ms)
            return
        flow.ended = True
        abandoned: dict[GpuKey, None] = {}
        for task in flow.workflow.tasks:
            if task.task_id in flow.dispatched:
                continue
            task_id = workflow_task_id(flow.job_id, task.task_id)
            self._tasks.pop(task_id, None)
            self._backlogs.items.pop(task_id)
            gpu = self._gpus[flow.gpu[task.task_id]]
            gpu.unplan(task_id, task.model)
            self._touch(gpu, now_ms)
            abandoned[gpu.key] = None
        flow.abandoned = tuple(abandoned)

    def _forget(self, flow: Flow) -> None:
        del self._flows[flow.job_id]
        for task in flow.workflow.tasks:
            task_id = workflow_task_id(flow.job_id, task.task_id)
            self._tasks.pop(task_id, None)
            self._backlogs.items.pop(task_id)
            self._refusals.pop(task_id)

    def _touch_flow(self, flow: Flow) -> None:
        self._flows.touch(flow.job_id)


def _work(spec: JobSpec, now_ms: float) -> Work:
    """A workflow's work as the load counts it (``load``)."""
    assert spec.workflow is not None
    return Work(now_ms, spec.gpu_type, spec.workflow.work_ms)


def _want(spec: JobSpec) -> Want:
    """What a GPU needs to take the workflow: its type, room for its largest model."""
    assert spec.workflow is not None
    return Want(spec.gpu_type, spec.workflow.largest_model_mb, spec.allocation)
