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
from typing import NamedTuple

from libs.core.compass.backlog import Backlogs
from libs.core.compass.flow import Flow
from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.load import Load, Work
from libs.core.compass.order import GpuOrder
from libs.core.compass.planner import Assignment, Input, PlanMode, Planner
from libs.core.compass.pool import BatchGpus, Pool, PoolChange, Want
from libs.core.compass.timeline import GpuState, Pending, Timeline
from libs.core.compass.worker import Ahead, queue_wait
from libs.core.compass.workflow import BYTES_PER_MB, CacheModel, Costs, Task, Workflow
from libs.core.config import PolicyConfig
from libs.core.decisions import (
    Cancel,
    Decision,
    JobLost,
    Place,
    Planned,
    PlannedTask,
    ServingTask,
    Stop,
    StopCause,
    TaskLost,
    Wait,
)
from libs.core.ids import JobId, NodeId, TaskId, workflow_task_id
from libs.core.inputs import PeerArrived, PeerPlaced, PeerPlanned, TaskRefused
from libs.core.model import JobSpec, NodeSpec
from libs.core.state import State, Table

__all__ = ["MB_PER_GIB", "BatchGpus", "GpuKey", "Serving"]

MB_PER_GIB = (1 << 30) / BYTES_PER_MB  # node memory is in GiB
# A task refused this often is sent without a wait limit: it goes somewhere at last.
MAX_REFUSALS = 3


class Peer(NamedTuple):
    """Another planner's task in this one's GPU queues: where, and whose."""

    gpu: GpuKey
    job_id: JobId


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
        self._peers: Table[TaskId, Peer] = state.table("serving.peers")
        # This planner's tasks that GPUs refused, and how often, till they end.
        self._refusals: Table[TaskId, int] = state.table("serving.refusals")
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
        peer = self._peers.get(task_id)
        if peer is not None:
            return node_of(peer.gpu) == node_id
        known = self._tasks.get(task_id)
        return known is not None and self._flows[known[0]].gpu[known[1].task_id][0] == node_id

    def peer_placed(self, event: PeerPlaced, now_ms: float) -> None:
        """Another planner sent a task to a GPU: it is in that GPU's queue, here too,
        and no longer where the peer's plan had it. One it knows as sent already, or
        has no GPU for, changes nothing (the scheduler refuses one of its own jobs')."""
        task = event.task
        task_id = TaskId(task.task_id)
        gpu = self._gpus.get((task.node_id, task.gpu_index))
        if gpu is None or task_id in self._tasks:
            return
        if task_id in self._peers and not self._unplan_peer(task_id, now_ms):
            return  # sent already
        self._peers[task_id] = Peer(gpu.key, JobId(event.job_id))
        self._backlogs.items[task_id] = Pending(
            task.model, task.model_mb, task.run_ms, task.ready_ms, sent=True
        )
        gpu.send(task_id, task.ready_ms)
        self._touch(gpu)

    def peer_planned(self, event: PeerPlanned) -> None:
        """Another planner planned a workflow: its tasks not yet sent hold their places
        in their GPUs' queues here, as this planner's own planned tasks do, so that
        its plans do not count on GPUs a peer has already promised. A task it knows,
        or has no GPU for, is left out (a second word of the plan changes nothing)."""
        job_id = JobId(event.job_id)
        for task in event.tasks:
            task_id = TaskId(task.task_id)
            gpu = self._gpus.get((task.node_id, task.gpu_index))
            if gpu is None or task_id in self._peers or task_id in self._tasks:
                continue
            self._peers[task_id] = Peer(gpu.key, job_id)
            self._backlogs.items[task_id] = Pending(
                task.model, task.model_mb, task.run_ms, task.ready_ms, sent=False
            )
            gpu.plan(task_id, task.model, task.ready_ms)
            self._touch(gpu)

    def _unplan_peer(self, task_id: TaskId, now_ms: float) -> bool:
        """A peer's task leaves the GPU its plan had it on (it was sent, or dropped);
        False if it was not planned there (it was sent already)."""
        gpu = self._gpus[self._peers[task_id].gpu]
        if task_id not in gpu.planned:
            return False
        gpu.unplan(task_id, self._backlogs.items[task_id].model)
        self._touch(gpu, now_ms)
        return True

    def _drop_peer_plan(self, job_id: JobId, now_ms: float) -> None:
        """The peer gave up on its workflow: the tasks it planned and never sent go
        (a scan of the peers' tasks, on a failure, a loss or a cancel only)."""
        unsent = [
            task_id
            for task_id, peer in self._peers.items()
            if peer.job_id == job_id and task_id in self._gpus[peer.gpu].planned
        ]
        for task_id in unsent:
            self._drop_peer(task_id, now_ms)

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
        peer = self._peers.get(task_id)
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
        peer = self._peers.get(task_id)
        if peer is not None:
            self._drop_peer(task_id, now_ms)
            if exit_code != 0:  # its planner abandons the workflow
                self._drop_peer_plan(peer.job_id, now_ms)
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
                    decisions += self._send(flow, flow.workflow.task(child), now_ms)
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
        if task_id in self._peers:  # its planner knows whether it had a limit
            self._drop_peer(task_id, now_ms)
            return []
        if not self._limited(task_id):
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
        return self._send(flow, task, now_ms, refused=event)

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

    def _why_waiting(self, job_id: JobId, spec: JobSpec, now_ms: float) -> str:
        if self._sheds(job_id, spec, now_ms):
            return (
                "held while workflows bring more work than the serving GPUs run "
                f"({self.config.admit_load:g}× their time): those with the most work "
                "wait, each till its due time at the latest"
            )
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
                if (peer := self._peers.get(task_id)) is not None:
                    self._drop_peer(task_id, now_ms)
                    peers[peer.job_id] = None
                else:
                    hit[self._tasks[task_id][0]] = None
        for job_id in peers:
            self._drop_peer_plan(job_id, now_ms)
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
        self._drop_peer_plan(job, now_ms)
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
            why = self._why_waiting(job_id, spec, now_ms)
            return f"{why}; {ahead} workflow(s) ahead of it"
        flow = self._flows.get(job_id)
        return None if flow is None else flow.describe(self.mode.value)

    # -- planning ------------------------------------------------------------

    def _plan(self, job_id: JobId, spec: JobSpec, now_ms: float) -> list[Decision] | _NotPlanned:
        workflow = spec.workflow
        assert workflow is not None
        need_mb = workflow.largest_model_mb
        views = self._views(spec, workflow, need_mb, now_ms)
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
            taken += self._acquire(gpu, spec.allocation)
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
                decisions += self._send(flow, task, now_ms)
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

    def _views(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float
    ) -> dict[GpuKey, GpuState]:
        """The GPUs a plan may use (``Pool.candidates``), as the planner sees them."""
        return {
            key: self._backlogs.view(self._gpus[key], now_ms)
            for key in self._candidates(spec, workflow, need_mb, now_ms)
        }

    def _candidates(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float
    ) -> list[GpuKey]:
        return self.pool.candidates(spec, workflow, need_mb, now_ms, spread=self.mode.hashed)

    def _send(
        self, flow: Flow, task: Task, now_ms: float, refused: TaskRefused | None = None
    ) -> list[Decision]:
        """Send a ready task to its GPU, adjusting first when the plan went stale (or
        elsewhere, when that GPU ``refused`` it), with the wait it may take there."""
        task_id = workflow_task_id(flow.job_id, task.task_id)
        planned = self._gpus[flow.gpu[task.task_id]]
        planned.unplan(task_id, task.model)
        if refused is None:
            target, reason = self._adjust(flow, task, planned, now_ms)
        else:
            target, reason = self._leave(flow, task, planned, refused, now_ms)
        limit = self._wait_limit(task_id, task, target, flow, now_ms)
        kept = self._backlogs.kept(now_ms, planned.key, target.key)
        self._touch(planned, now_ms)
        decisions: list[Decision] = []
        if target is not planned:
            flow.move(task.task_id, target.key)
            decisions += self._acquire(target, flow.spec.allocation)
        target.send(task_id, self._backlogs.ready(task_id))
        self._touch(target)
        target.restated.add(task_id)  # its arrival, set below, shows from the next touch
        flow.dispatch(task.task_id)
        arrival = self._arrival(flow, task, target, now_ms)
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

    def _wait_limit(
        self, task_id: TaskId, task: Task, target: Gpu, flow: Flow, now_ms: float
    ) -> float | None:
        """compass: the wait this planner expects at the GPU for the task sent now, as
        its node agent will count it (``queue_wait``, over what was sent there before
        it), plus ``refuse_margin`` × its run time; None (no limit) in the other
        modes, with no margin, and for a task refused ``MAX_REFUSALS`` times."""
        if not self._limited(task_id):
            return None
        sent = self._backlogs.view(target, now_ms, sent_only=True)
        ahead = [Ahead(p.ready_ms, p.model, p.model_mb, p.run_ms) for p in sent.backlog]
        ready = max(now_ms, self._arrival(flow, task, target, now_ms))
        mb_per_ms = self._costs.host_to_gpu_mb_per_ms
        wait = queue_wait(sent.free_at_ms, sent.resident, ahead, ready, mb_per_ms)
        return wait + self.config.refuse_margin * task.run_ms

    def _arrival(self, flow: Flow, task: Task, target: Gpu, now_ms: float) -> float:
        """When the task's inputs reach ``target``: the last parent's end and transfer."""
        return max(
            (
                flow.finished[p]
                + self._costs.transfer_ms(task.in_kb, flow.gpu[p][0] == target.key[0])
                for p in task.parents
            ),
            default=now_ms,
        )

    def _limited(self, task_id: TaskId) -> bool:
        """Whether the task is sent with a wait limit (so it may be refused)."""
        return (
            self.mode is PlanMode.COMPASS
            and bool(self.config.refuse_margin)
            and self._refusals.get(task_id, 0) < MAX_REFUSALS
        )

    def _leave(
        self, flow: Flow, task: Task, refusing: Gpu, refused: TaskRefused, now_ms: float
    ) -> tuple[Gpu, str]:
        """The GPU where the refused task would start first, other than the one that
        refused it (that one only if no other may take it)."""
        own = self._backlogs.line(refusing, now_ms).timeline
        target = self._elsewhere(flow, task, own, now_ms, 0.0, leave=True)
        if target is None:
            return refusing, ""
        return target, f"refused by {refusing.label}: {refused.wait_ms:.0f} ms of work queued there"

    def _elsewhere(
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
            for key in self._candidates(flow.spec, flow.workflow, task.model_mb, now_ms)
        }
        chosen = self._planner.adjust(
            task, own, list(lines), now_ms, threshold, inputs=_inputs(flow, task), leave=leave
        )
        return None if chosen is own else self._gpus[lines[chosen]]

    def _adjust(self, flow: Flow, task: Task, planned: Gpu, now_ms: float) -> tuple[Gpu, str]:
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
        target = self._elsewhere(flow, task, own.timeline, now_ms, threshold)
        if target is None:
            return planned, ""
        if self.mode is PlanMode.JIT:
            return target, "re-routed at run time (jit)"
        return target, (
            f"{wait:.0f} ms wait on {planned.label} exceeds {threshold:g}× its "
            f"{task.run_ms:g} ms run"
        )

    # -- bookkeeping ---------------------------------------------------------

    def _acquire(self, gpu: Gpu, allocation: str) -> list[Decision]:
        """A plan uses the GPU: serving holds it, charged to the plan's allocation."""
        taken = self.pool.take(gpu.key, allocation)
        self._touch(gpu)
        return list(taken)

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

    def _drop_peer(self, task_id: TaskId, now_ms: float) -> None:
        """A peer's task ended, or will never be sent: it leaves its GPU's queue."""
        self._unplan_peer(task_id, now_ms)
        gpu = self._gpus[self._peers[task_id].gpu]
        del self._peers[task_id]
        self._backlogs.items.pop(task_id)
        gpu.dispatched.pop(task_id, None)
        gpu.started.pop(task_id, None)
        self._touch(gpu, now_ms)

    def _forget(self, flow: Flow) -> None:
        del self._flows[flow.job_id]
        for task in flow.workflow.tasks:
            task_id = workflow_task_id(flow.job_id, task.task_id)
            self._tasks.pop(task_id, None)
            self._backlogs.items.pop(task_id)
            self._refusals.pop(task_id)

    def _touch(self, gpu: Gpu, now_ms: float | None = None) -> None:
        """Fold a GPU's change into the digest; a drained pool GPU starts lingering.

        Every change to what its fact reads is followed by a touch, so the fact,
        written when the digest is read, is what it would have been here.
        """
        self.pool.linger(gpu.key, gpu.busy, now_ms)
        self._backlogs.touched(gpu)
        self._gpus.touch(gpu.key)

    def _touch_flow(self, flow: Flow) -> None:
        self._flows.touch(flow.job_id)


def _inputs(flow: Flow, task: Task) -> list[Input]:
    """Where the task's inputs come from, and when: each parent's node and end."""
    return [Input(node_of(flow.gpu[p]), flow.finished[p]) for p in task.parents]


def _work(spec: JobSpec, now_ms: float) -> Work:
    """A workflow's work as the load counts it (``load``)."""
    assert spec.workflow is not None
    return Work(now_ms, spec.gpu_type, spec.workflow.work_ms)


def _want(spec: JobSpec) -> Want:
    """What a GPU needs to take the workflow: its type, room for its largest model."""
    assert spec.workflow is not None
    return Want(spec.gpu_type, spec.workflow.largest_model_mb, spec.allocation)
