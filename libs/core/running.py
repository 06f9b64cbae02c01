"""Running batch work: each job's tasks, the node and GPUs each holds, and how the
job is being stopped, with an index of the jobs on each node.

A job runs from its placement until its last task ends; a gang's tasks end one
by one. ``version`` moves whenever running work changes, so a preemption plan
that failed is not searched for again until something it looked at changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

from libs.core.config import PolicyConfig
from libs.core.contract import RECLAIM_TURN_S, RunningJob
from libs.core.decisions import PreemptionRule, Protection, StopCause
from libs.core.ids import JobId, NodeId, TaskId
from libs.core.model import JobSpec
from libs.core.queues import Waiting
from libs.core.rooms import Room, RoomIndex, bound, room_of
from libs.core.state import State, Table

Tasks = dict[TaskId, tuple[NodeId, tuple[int, ...]]]  # task id -> (node id, GPU indices)


@dataclass(frozen=True)
class Running:
    job_id: JobId
    spec: JobSpec
    seq: int
    attempt: int
    placed_at: float
    tasks: Tasks  # kept as placed: ``ended`` says which are over
    started_at: float | None = None
    idle: bool = False
    stopping: StopCause | None = None
    ended: tuple[TaskId, ...] = ()  # sorted
    lost: str = ""  # why its node was lost, when it was
    estimate_s: float | None = None  # how long it was expected to run when placed
    borrowed: bool = False  # placed beyond its allocation's share (``contract.borrows``)
    stop_reason: str = ""  # why it is being stopped, for people: its end repeats it
    failed: str = ""  # the first part to exit non-zero: "exited with code 3" (a gang: its rank)
    checkpointed_at: float | None = None  # when a task of it last said it saved
    master_port: int = 0  # a gang's rendezvous port, on its rank 0's node

    def but(self, **changes: object) -> Running:
        """A copy with ``changes``: ``dataclasses.replace`` without its cost (a few µs,
        on every task start and end), as the class has no ``__post_init__``."""
        run = object.__new__(Running)
        run.__dict__.update(self.__dict__, **changes)
        if "tasks" in changes:
            run.__dict__.pop("_tasks_text", None)
        return run

    @cached_property
    def _tasks_text(self) -> str:
        """The tasks as the digest hashes them: a gang's are many, and the job is
        rewritten (and hashed) as each of its tasks starts and ends."""
        return str(self.tasks)

    def fact(self) -> str:
        """Every field, for the state digest (the job id is the table's key)."""
        return (
            f"{self.seq}|{self.attempt}|{self.placed_at}|{self._tasks_text}|{self.started_at}"
            f"|{self.idle}|{self.stopping}|{self.ended}|{self.lost}|{self.estimate_s}"
            f"|{self.borrowed}|{self.stop_reason}|{self.failed}|{self.master_port}"
            f"|{self.checkpointed_at}"
            f"|{self.spec.fact}"
        )

    def unprotected_borrower(self, config: PolicyConfig) -> bool:
        """On borrowed GPUs, which the policy does not protect (``protect_borrowed``)."""
        return self.borrowed and not config.protect_borrowed

    def contract_s(self, config: PolicyConfig) -> float:
        """How long its contract runs from its start: its minimum runtime, capped."""
        return min(self.spec.min_runtime_s, config.max_min_runtime_s)

    def protect_s(self, config: PolicyConfig) -> float:
        """How long its contract protects it from its start; none on borrowed GPUs unless
        the policy protects those too."""
        return 0.0 if self.unprotected_borrower(config) else self.contract_s(config)

    def borrowed_until(self, config: PolicyConfig) -> float:
        """Unprotected on borrowed GPUs, the end of its turn there: the runtime its
        contract would protect elsewhere, at most ``RECLAIM_TURN_S``
        (``contract.RunningJob.borrowed_until``)."""
        if self.started_at is None or not self.unprotected_borrower(config):
            return -math.inf
        return self.started_at + min(self.contract_s(config), RECLAIM_TURN_S)

    def protection(self, config: PolicyConfig) -> Protection:
        """What protects it from preemption, as it is placed."""
        if not self.spec.allocated:
            return Protection.FREE
        return Protection.BORROWED if self.unprotected_borrower(config) else Protection.CONTRACT

    def preemption_rule(self, config: PolicyConfig, now: float) -> PreemptionRule:
        """The rule that lets other work stop it ``now`` (planning has checked one does):
        free work always yields; charged work on borrowed GPUs, within the runtime its
        contract would otherwise protect, is taken back; the rest is past its contract."""
        if not self.spec.allocated:
            return PreemptionRule.FREE_WORK
        within = self.started_at is None or now < self.started_at + self.contract_s(config)
        if self.unprotected_borrower(config) and within:
            return PreemptionRule.BORROWED
        return PreemptionRule.CONTRACT_ENDED

    def warning_s(self, config: PolicyConfig) -> float:
        """How long before SIGTERM its warning comes, capped by the policy."""
        return (
            min(self.spec.warning_s, config.max_stop_warning_s) if self.spec.warning_signal else 0.0
        )

    def deadline(self, config: PolicyConfig) -> float | None:
        """When its time limit stops it (its warning first, so that SIGTERM comes at the
        limit): from its start; None without a limit, before it starts, or once it is
        being stopped."""
        limit = self.spec.time_limit_s
        if not limit or self.started_at is None or self.stopping is not None:
            return None
        return self.started_at + max(limit - self.warning_s(config), 0.0)

    def protected_until(self, config: PolicyConfig) -> float | None:
        if not self.spec.allocated or self.started_at is None:
            return None
        return self.started_at + self.protect_s(config)


class RunningWork:
    DERIVED = ("_on_node", "_preemptible", "_room", "free_work_gpus", "_deadlines")

    def __init__(self, config: PolicyConfig, state: State) -> None:
        self.config = config
        self.jobs: Table[JobId, Running] = state.table("running", Running.fact)
        self._version = state.cell("running_version", 0)
        # Indexes over ``jobs`` (``derived`` rebuilds them):
        self._on_node: dict[NodeId, dict[JobId, None]] = {}  # node -> its jobs (an ordered set)
        # node -> its jobs that preemption may consider, in ``_on_node``'s order: planning
        # reads them for every blocked job, far more often than running work changes.
        self._preemptible: dict[NodeId, dict[JobId, RunningJob]] = {}
        # node -> its preemptible jobs as ``rooms.Room`` entries, sorted: what bounds the
        # room a plan may free there, kept as jobs change so that a plan skips most
        # nodes without weighing their jobs.
        self._room: dict[NodeId, tuple[Room, ...]] = {}
        # A memo of ``_room`` for a window of the clock (``rooms.RoomIndex``): the nodes
        # that may have room at all, so that a plan does not bound every node's.
        self._roomy = RoomIndex()
        self.free_work_gpus = 0  # GPUs held by running free work: debug work's headroom
        self._deadlines: dict[JobId, float] = {}  # job -> when its time limit stops it

    @property
    def version(self) -> int:
        return self._version.value

    def changed(self) -> None:
        """Running work, or how it ranks, changed: failed preemption plans are stale."""
        self._version.value += 1

    def on_node(self, node_id: NodeId) -> list[JobId]:
        """The jobs with a task on the node that has not ended."""
        return list(self._on_node.get(node_id, {}))

    def held_on(self, node_id: NodeId) -> set[int]:
        """The node's GPUs that running tasks hold."""
        return {
            gpu
            for job_id in self._on_node.get(node_id, {})
            for task_node, gpus in self.jobs[job_id].tasks.values()
            if task_node == node_id
            for gpu in gpus
        }

    def place(
        self,
        job: Waiting,
        tasks: Tasks,
        now: float,
        estimate_s: float | None,
        borrowed: bool,
        master_port: int = 0,
    ) -> Running:
        for node_id, _ in tasks.values():
            self._on_node.setdefault(node_id, {})[job.job_id] = None
        run = Running(
            job.job_id,
            job.spec,
            job.seq,
            job.attempt,
            now,
            tasks,
            estimate_s=estimate_s,
            borrowed=borrowed,
            master_port=master_port,
        )
        self._put(run)
        if not job.spec.allocated:
            self.free_work_gpus += job.spec.gpus
        self.changed()
        return run

    def update(self, job_id: JobId, **changes: object) -> None:
        run = self.jobs.get(job_id)
        if run is not None:
            self._put(run.but(**changes))
            self.changed()

    def started(self, job_id: JobId, task_id: TaskId, at: float) -> None:
        """A task started: the job's contract runs from its first task's start."""
        run = self.jobs.get(job_id)
        if run is not None and task_id in run.tasks and run.started_at is None:
            self.update(job_id, started_at=at)

    def checkpointed(self, job_id: JobId, task_id: TaskId, at: float) -> None:
        """A task of the job said it saved (a report naming a task not the job's, or
        older than the last, is not believed)."""
        run = self.jobs.get(job_id)
        if run is not None and task_id in run.tasks and at > (run.checkpointed_at or -math.inf):
            self.update(job_id, checkpointed_at=at)

    def idle(self, job_id: JobId, task_id: TaskId, idle: bool) -> None:
        """A task's GPUs went idle, or busy again (a report that names no task counts
        for the job; one that names a task not the job's is not believed)."""
        run = self.jobs.get(job_id)
        if run is not None and (not task_id or task_id in run.tasks):
            self.update(job_id, idle=idle)

    def end(self, job_id: JobId, task_id: TaskId, node_id: NodeId) -> Running | None:
        """A task ended: the job as it is now (gone from here once its last task ended),
        or None for a report not believed (about no such task, another node than the
        task's, or a task already over)."""
        run = self.jobs.get(job_id)
        if run is None or task_id in run.ended:
            return None
        task = run.tasks.get(task_id)
        if task is None or task[0] != node_id:
            return None
        run = run.but(ended=tuple(sorted((*run.ended, task_id))))
        self._put(run)
        self.changed()
        self._on_node.get(node_id, {}).pop(job_id, None)
        if len(run.ended) == len(run.tasks):
            del self.jobs[job_id]
            self._deadlines.pop(job_id, None)
            if not run.spec.allocated:
                self.free_work_gpus -= run.spec.gpus
        return run

    def past_deadline(self, now: float) -> list[JobId]:
        """The running jobs whose time limit has come by ``now``, soonest first."""
        if not self._deadlines:
            return []
        due = [(at, job_id) for job_id, at in self._deadlines.items() if at <= now]
        return [job_id for _, job_id in sorted(due)]

    def ports_in_use(self, node_id: NodeId) -> set[int]:
        """The rendezvous ports of the gangs whose rank 0 runs on ``node_id``."""
        ports = set()
        for job_id in self._on_node.get(node_id, {}):
            run = self.jobs[job_id]
            if run.master_port and next(iter(run.tasks.values()))[0] == node_id:
                ports.add(run.master_port)
        return ports

    def preemptible_by_node(self) -> Mapping[NodeId, Iterable[RunningJob]]:
        """The jobs not already stopping, by node, as preemption sees them: a gang once
        on each node it spans (a view: read it before running work changes)."""
        return _ByNode(self._preemptible)

    def room_bound(
        self, now: float, *, lossless: bool, free_work: bool = False
    ) -> Callable[[NodeId], int]:
        """node -> at most the GPUs a plan at ``now`` may free there by stopping work:
        that of jobs no longer protected (and, ``lossless``, that lose nothing yet;
        ``free_work``, that are not charged). Planning's victim rules
        (``preemption.plan_preemption``) only ever take fewer."""
        rooms = self._room

        def node_bound(node_id: NodeId) -> int:
            return bound(rooms.get(node_id, ()), now, lossless=lossless, free_work=free_work)

        return node_bound

    def roomy(
        self, now: float, gpus: int, *, lossless: bool, free_work: bool = False
    ) -> list[NodeId]:
        """The nodes where ``room_bound`` at ``now`` (of free work only, ``free_work``) may
        reach ``gpus``: every node where it does, and few where it does not (in no order)."""
        if not self._roomy.covers(now):
            self._roomy.rebuild(self._room, now)
        return self._roomy.at_least(gpus, lossless=lossless, free_work=free_work)

    def rooms(self, node_id: NodeId) -> tuple[Room, ...]:
        """The node's preemptible jobs as ``rooms.Room`` entries (a new tuple whenever
        they change: a memo of them may key on it)."""
        return self._room.get(node_id, ())

    def _put(self, run: Running) -> None:
        """Write the job, and keep its places among the preemptible ones (a job only
        ever leaves them: by stopping, or by a task ending) and their nodes' rooms."""
        before = self.jobs.get(run.job_id)
        self.jobs[run.job_id] = run
        deadline = run.deadline(self.config)
        if deadline is None:
            self._deadlines.pop(run.job_id, None)
        else:
            self._deadlines[run.job_id] = deadline
        if before is not None and not _may_be_victim(before):
            return  # it left them already: a gang's parts end one by one, each a write
        for node_id, victim in self._as_victims(run, run.tasks).items():
            on = self._preemptible.get(node_id)
            if victim is not None:
                if on is None:
                    on = self._preemptible[node_id] = {}
                on[run.job_id] = victim
            elif on is None or on.pop(run.job_id, None) is None:
                continue  # the node's preemptible jobs did not change
            if on:
                rooms = self._room[node_id] = room_of(on.values())
            else:
                rooms = ()
                self._room.pop(node_id, None)
            self._roomy.put(node_id, rooms)

    def _as_victims(self, run: Running, tasks: Tasks) -> dict[NodeId, RunningJob | None]:
        """The job as preemption sees it on each node of ``tasks``; None where it is not
        a candidate: already going, or partly over (a gang lives and dies whole)."""
        candidate = _may_be_victim(run)
        return {
            node_id: RunningJob(
                run.job_id,
                run.spec,
                node_id,
                len(gpus),
                run.started_at,
                run.idle,
                run.seq,
                run.protect_s(self.config),
                run.estimate_s,
                run.checkpointed_at,
                run.borrowed_until(self.config),
            )
            if candidate
            else None
            for node_id, gpus in tasks.values()
        }

    def derived(self) -> dict[str, object]:
        """The indexes (``DERIVED``) rebuilt from ``jobs`` alone."""
        on_node: dict[NodeId, dict[JobId, None]] = {}
        for job_id, run in self.jobs.items():
            for task_id, (node_id, _) in run.tasks.items():
                if task_id not in run.ended:
                    on_node.setdefault(node_id, {})[job_id] = None
        preemptible: dict[NodeId, dict[JobId, RunningJob]] = {}
        for node_id, job_ids in on_node.items():
            for job_id in job_ids:
                run = self.jobs[job_id]
                live = {t: task for t, task in run.tasks.items() if task[0] == node_id}
                victim = self._as_victims(run, live)[node_id]
                if victim is not None:
                    preemptible.setdefault(node_id, {})[job_id] = victim
        free_work = sum(run.spec.gpus for run in self.jobs.values() if not run.spec.allocated)
        room = {node_id: room_of(jobs.values()) for node_id, jobs in preemptible.items()}
        deadlines = {
            job_id: deadline
            for job_id, run in self.jobs.items()
            if (deadline := run.deadline(self.config)) is not None
        }
        return {
            "_on_node": on_node,
            "_preemptible": preemptible,
            "_room": room,
            "free_work_gpus": free_work,
            "_deadlines": deadlines,
        }


def _may_be_victim(run: Running) -> bool:
    """Whether preemption may choose the job: not already going, nor partly over."""
    return run.stopping is None and not run.ended


class _ByNode(Mapping[NodeId, Iterable[RunningJob]]):
    """Node -> its preemptible jobs, read through (every plan reads a few nodes of many)."""

    __slots__ = ("_jobs",)

    def __init__(self, jobs: dict[NodeId, dict[JobId, RunningJob]]) -> None:
        self._jobs = jobs

    def __getitem__(self, node_id: NodeId) -> Iterable[RunningJob]:
        return self._jobs[node_id].values()

    def get(self, node_id: NodeId, default: Iterable[RunningJob] = ()) -> Iterable[RunningJob]:  # type: ignore[override]  # one signature is all planning uses
        jobs = self._jobs.get(node_id)
        return default if jobs is None else jobs.values()

    def __iter__(self) -> Iterator[NodeId]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)
