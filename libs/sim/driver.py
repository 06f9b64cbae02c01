"""The discrete-event simulator: one policy, simulated nodes, a simulated clock.

Events sit on a heap ordered by (time, kind, sequence); at equal times, tasks
end before cancellations, cancellations before submissions, and usage
snapshots before ticks, and otherwise first pushed runs first, so a run is a
pure function of the workload, the policy and the settings. Every input goes
through ``Policy.handle``; its decisions are applied here the way node agents
and the projector would act on them:

* ``Place``: the GPUs must be free (a GPU given twice is a policy bug and
  stops the run). The task starts at once (``TaskStarted``). A job runs once
  all its GPUs are placed; it ends after the GPU time it still needs.
* ``Stop``: SIGTERM to the whole placement (a gang lives and dies together);
  its tasks end ``stop_grace_s`` later, unless the job finishes first.
  Resumable work checkpoints at SIGTERM; other work loses its progress.
* ``Requeue``: the job waits again. ``Preempted`` and ``Cancel``: it is over.
* Usage snapshots come from ``WindowedUsage`` fed with the task lifecycle,
  as the projector computes them, every ``snapshot_s``; ticks every
  ``tick_s``. Both are skipped while nothing waits (nothing to decide), and a
  submission after such a lull gets a fresh snapshot first.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from libs.core.config import DAY
from libs.core.decisions import Cancel, Decision, Place, Preempted, Requeue, Stop, StopCause
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    NodeJoined,
    TaskEnded,
    TaskStarted,
    Tick,
    UsageSnapshot,
)
from libs.core.usage import WindowedUsage
from libs.sim.metrics import JobOutcome, Metrics, Recorder
from libs.sim.policy import Policy
from libs.sim.workload import SimJob, Workload

SIGTERM_EXIT = 143

# Event kinds, in the order they run at equal times.
_COMPLETE, _STOP_END, _CANCEL, _ARRIVE, _SNAPSHOT, _TICK = range(6)

# Job states. A job is placing until all GPUs of its gang are placed; stopped
# when its tasks ended on a preemption and the policy has not yet said what next.
WAITING, PLACING, RUNNING = "waiting", "placing", "running"
STOPPING, STOPPED = "stopping", "stopped"
FINISHED, CANCELLED, LOST = "finished", "cancelled", "lost"
_OVER = (FINISHED, CANCELLED, LOST)


class SimulationError(RuntimeError):
    """The policy broke a rule no scheduler may break; the message says which."""


@dataclass(frozen=True)
class SimSettings:
    tick_s: float = 60.0
    # A snapshot costs O(running tasks) in WindowedUsage; every 5 minutes keeps it to a few
    # percent of a run, and a 7-day fair-share window moves little in 5 minutes.
    snapshot_s: float = 300.0
    stop_grace_s: float = 30.0
    lookback_window_s: float = 7 * DAY  # the snapshots' window: the policy's lookback
    gpu_prices: tuple[tuple[str, float], ...] = ()  # the policy's price table
    drain_s: float = 0.0  # keep simulating this long after the last submission
    # Measure from this long after the first submission: an emptied cluster takes a while to
    # fill, and that ramp says nothing about the policy. Jobs submitted before are not measured.
    warmup_s: float = 0.0
    sample_s: float = 600.0  # time-series resolution for plots
    enough_demand: float = 0.5  # see libs.sim.metrics


class _Job:
    __slots__ = (
        "finished",
        "first_start",
        "gen",
        "placed",
        "preemptions",
        "progress_s",
        "run_start",
        "sim",
        "state",
        "stop_cause",
        "tasks",
    )

    def __init__(self, sim: SimJob) -> None:
        self.sim = sim
        self.state = WAITING
        self.gen = 0  # placements so far; events for an older one are stale
        self.tasks: list[str] = []  # of the current placement
        self.placed = 0
        self.progress_s = 0.0  # work done, kept across a resumable preemption
        self.run_start = 0.0
        self.stop_cause = StopCause.PREEMPTED
        self.first_start: float | None = None
        self.finished: float | None = None
        self.preemptions = 0


class _Task:
    __slots__ = ("gpus", "job", "node_id")

    def __init__(self, job: _Job, node_id: str, gpus: tuple[int, ...]) -> None:
        self.job = job
        self.node_id = node_id
        self.gpus = gpus


@dataclass(frozen=True)
class _StopEnd:
    job: _Job
    gen: int
    task_ids: tuple[str, ...]
    finishes: bool  # the job's work runs out within the grace: it exits 0


class Simulation:
    def __init__(
        self, workload: Workload, policy: Policy, settings: SimSettings, name: str = ""
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.settings = settings
        self.name = name or type(policy).__name__
        jobs = workload.jobs
        self.start = jobs[0].at if jobs else 0.0
        self.end = (jobs[-1].at if jobs else 0.0) + settings.drain_s
        self.now = self.start
        self.recorder = Recorder(
            workload.capacity,
            workload.tree.entitlements(),
            min(self.start + settings.warmup_s, self.end),
            self.end,
            settings.sample_s,
            settings.enough_demand,
        )
        self.usage = WindowedUsage(settings.lookback_window_s)
        self.inputs = 0
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._pending: deque[Input] = deque()
        self._jobs: dict[str, _Job] = {}
        self._tasks: dict[str, _Task] = {}
        self._busy: dict[str, list[bool]] = {}
        self._price: dict[str, float] = {}  # per node: what its GPU-seconds cost
        self._waiting = 0
        self._last_snapshot = -float("inf")

    def run(self) -> Metrics:
        self._feed(BudgetSet(self.start, self.workload.tree))
        for node in self.workload.nodes:
            self._busy[node.node_id] = [False] * (max(node.gpu_indices, default=-1) + 1)
            self._price[node.node_id] = dict(self.settings.gpu_prices).get(node.gpu_type, 1.0)
            self._feed(NodeJoined(self.start, node))
        for job in self.workload.jobs:
            self._push(job.at, _ARRIVE, job)
        for at, job_id in self.workload.cancels:
            self._push(at, _CANCEL, job_id)
        self._push(self.start, _SNAPSHOT, None)
        self._push(self.start, _TICK, None)
        heap, recorder, settings = self._heap, self.recorder, self.settings
        while heap and heap[0][0] <= self.end:
            at, kind, _, payload = heapq.heappop(heap)
            self.now = at
            recorder.advance(at)
            if kind == _COMPLETE:
                self._complete(*payload)  # type: ignore[misc]
            elif kind == _STOP_END:
                self._stop_end(payload)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == _CANCEL:
                self._feed(CancelRequested(at, payload))  # type: ignore[arg-type]
            elif kind == _SNAPSHOT:
                self._push(at + settings.snapshot_s, _SNAPSHOT, None)
                if self._waiting:
                    self._snapshot()
            else:
                self._push(at + settings.tick_s, _TICK, None)
                if self._waiting:
                    self._feed(Tick(at))
        return recorder.finish(self._outcomes(), self.name, self.inputs)

    # --- events ---

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, kind, self._seq, payload))

    def _arrive(self, sim: SimJob) -> None:
        if sim.job_id in self._jobs:
            return  # a repeated submission; the policy ignores it too
        self._jobs[sim.job_id] = _Job(sim)
        self._waiting += 1
        self.recorder.waiting(sim.spec, 1)
        if self.now - self._last_snapshot >= self.settings.snapshot_s:
            self._snapshot()
        self._feed(JobArrived(self.now, sim.job_id, sim.spec))

    def _complete(self, job: _Job, gen: int) -> None:
        if job.gen != gen or job.state != RUNNING:
            return  # stopped since this was scheduled
        job.state = FINISHED
        job.finished = self.now
        for task_id in job.tasks:
            self._end_task(task_id, 0)
        self._drain()

    def _stop_end(self, end: _StopEnd) -> None:
        job = end.job
        task_ids = end.task_ids
        if end.finishes:
            if job.state not in _OVER:
                self._leave_waiting(job, FINISHED)
                job.finished = self.now
            if job.gen != end.gen:  # placed again meanwhile: that run ends too
                task_ids += tuple(job.tasks)
        elif job.gen == end.gen and job.state == STOPPING:
            job.state = CANCELLED if job.stop_cause is StopCause.CANCELLED else STOPPED
        for task_id in task_ids:
            self._end_task(task_id, 0 if end.finishes else SIGTERM_EXIT)
        self._drain()

    def _snapshot(self) -> None:
        self._last_snapshot = self.now
        usage = self.usage.snapshot(self.now)
        self._feed(
            UsageSnapshot(
                self.now,
                self.settings.lookback_window_s,
                tuple((name, u.allocated_gpu_s) for name, u in usage.items()),
            )
        )

    # --- the policy ---

    def _feed(self, event: Input) -> None:
        self._pending.append(event)
        self._drain()

    def _drain(self) -> None:
        """Feed every pending input, including those the decisions cause, in order."""
        pending, handle, apply = self._pending, self.policy.handle, self._apply
        while pending:
            self.inputs += 1
            for decision in handle(pending.popleft()):
                apply(decision)

    def _apply(self, decision: Decision) -> None:
        match decision:
            case Place():
                self._place(decision)
            case Stop():
                self._stop(decision)
            case Requeue(job_id=job_id):
                job = self._job(job_id)
                if job.state in (STOPPING, STOPPED):
                    self.recorder.requeued()
                    if not job.sim.spec.resumable:
                        self._lose_progress(job)
                    job.state = WAITING
                    self._waiting += 1
                    self.recorder.waiting(job.sim.spec, 1)
            case Preempted(job_id=job_id):
                job = self._job(job_id)
                if job.state not in _OVER:
                    self._lose_progress(job)
                    self._leave_waiting(job, LOST)
            case Cancel(job_id=job_id):
                job = self._job(job_id)
                if job.state not in _OVER:
                    self._leave_waiting(job, CANCELLED)

    def _place(self, place: Place) -> None:
        job = self._job(place.job_id)
        busy = self._busy.get(place.node_id)
        if busy is None:
            raise SimulationError(f"{place.task_id}: placed on unknown node {place.node_id}")
        if place.task_id in self._tasks:
            raise SimulationError(f"{place.task_id}: placed while a task of that id runs")
        for gpu in place.gpu_indices:
            if gpu >= len(busy) or busy[gpu]:
                raise SimulationError(f"{place.task_id}: GPU {gpu} of {place.node_id} is not free")
            busy[gpu] = True
        spec = job.sim.spec
        gpus = len(place.gpu_indices)
        self._tasks[place.task_id] = _Task(job, place.node_id, place.gpu_indices)
        self.recorder.held(spec, gpus)
        self.usage.start(
            place.task_id,
            spec.allocation,
            gpus,
            allocated=spec.allocated,
            at=self.now,
            price=self._price[place.node_id],
        )
        self._pending.append(TaskStarted(self.now, place.job_id, place.task_id, place.node_id))
        if job.state in _OVER:
            self._end_task(place.task_id, 0)  # finished during a stop's grace: exits at once
            return
        if job.state not in (PLACING, RUNNING):
            self._leave_waiting(job, PLACING)
            job.gen += 1
            job.tasks = []
            job.placed = 0
            if job.first_start is None:
                job.first_start = self.now
        job.tasks.append(place.task_id)
        job.placed += gpus
        if job.placed > spec.gpus:
            raise SimulationError(f"{place.job_id}: placed on {job.placed} GPUs, asked {spec.gpus}")
        if job.placed == spec.gpus:
            job.state = RUNNING
            job.run_start = self.now
            remaining = max(job.sim.runtime_s - job.progress_s, 0.0)
            self._push(self.now + remaining, _COMPLETE, (job, job.gen))

    def _stop(self, stop: Stop) -> None:
        task = self._tasks.get(stop.task_id)
        if task is None:
            return  # already ended
        job = task.job
        if job.state == STOPPING and stop.cause is StopCause.CANCELLED:
            job.stop_cause = StopCause.CANCELLED  # cancelled while being preempted
        if stop.task_id not in job.tasks or job.state not in (PLACING, RUNNING):
            return  # this placement is already stopping (a gang gets one Stop per task)
        job.stop_cause = stop.cause
        if stop.cause is StopCause.PREEMPTED:
            job.preemptions += 1
            self.recorder.preempted(job.sim.spec)
        at = self.now + self.settings.stop_grace_s
        finishes = False
        if job.state == RUNNING:
            job.progress_s += self.now - job.run_start  # checkpointed at SIGTERM if resumable
            done_at = self.now + job.sim.runtime_s - job.progress_s
            finishes = done_at <= at
            at = min(at, done_at)
        job.state = STOPPING
        self._push(at, _STOP_END, _StopEnd(job, job.gen, tuple(job.tasks), finishes))

    # --- bookkeeping ---

    def _end_task(self, task_id: str, exit_code: int) -> None:
        """Free a task's GPUs; the policy hears of it with the pending inputs."""
        task = self._tasks.pop(task_id, None)
        if task is None:
            return
        busy = self._busy[task.node_id]
        for gpu in task.gpus:
            busy[gpu] = False
        self.recorder.held(task.job.sim.spec, -len(task.gpus))
        self.usage.end(task_id, self.now)
        job_id = task.job.sim.job_id
        self._pending.append(TaskEnded(self.now, job_id, task_id, task.node_id, exit_code))

    def _leave_waiting(self, job: _Job, state: str) -> None:
        if job.state == WAITING:
            self._waiting -= 1
            self.recorder.waiting(job.sim.spec, -1)
        job.state = state

    def _lose_progress(self, job: _Job) -> None:
        self.recorder.lost(job.progress_s * job.sim.spec.gpus)
        job.progress_s = 0.0

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise SimulationError(f"a decision names {job_id}, which was never submitted")
        return job

    def _outcomes(self) -> list[JobOutcome]:
        shown = {PLACING: RUNNING, STOPPING: STOPPED}
        return [
            JobOutcome(
                arrived=job.sim.at,
                spec=job.sim.spec,
                runtime_s=job.sim.runtime_s,
                first_start=job.first_start,
                finished=job.finished,
                preemptions=job.preemptions,
                outcome=shown.get(job.state, job.state),
            )
            for job in self._jobs.values()
        ]


def simulate(
    workload: Workload, policy: Policy, settings: SimSettings | None = None, *, name: str = ""
) -> Metrics:
    return Simulation(workload, policy, settings or SimSettings(), name).run()
