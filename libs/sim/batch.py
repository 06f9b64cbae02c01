"""Batch jobs as simulated node agents run them, for both simulators.

``BatchAgents`` applies the scheduler's batch decisions the way node agents
act on them, and keeps each job's lifecycle:

* ``Place``: the task starts at once (``TaskStarted``). A job runs once all
  the GPUs of its gang are placed; it finishes after the GPU time it still
  needs.
* ``Stop``: SIGTERM to the whole placement (a gang lives and dies together);
  its tasks end its grace later (``World.grace``: free work preempted for
  other work gets a short one), unless the job finishes first.
  Resumable work keeps its progress up to its last checkpoint: every
  ``checkpoint_s`` of a run, or at SIGTERM when ``checkpoint_s`` is 0 (the
  default, so it loses nothing); other work loses all its progress. What is
  lost counts when the job waits again or is given up.
* ``Requeue``: the job waits again. ``Preempted`` and ``Cancel``: it is over.
* ``Reject``: the policy refused the job (a CPU-only job of a trace, say): it
  never runs.

The tasks themselves run in the simulated cluster (``libs.sim.world``): it
claims and frees their GPUs, reports their starts and ends, and hands the
agents' events back at their times. An ``Observer`` counts
(``libs.sim.recorder.Recorder`` is one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.core.decisions import (
    Cancel,
    Decision,
    Place,
    Preempted,
    Reject,
    Requeue,
    Stop,
    StopCause,
)
from libs.core.model import JobSpec
from libs.sim.workload import SimJob
from libs.sim.world import SIGTERM_EXIT, SimulationError, World

# Job states. A job is placing until all GPUs of its gang are placed; stopped
# when its tasks ended on a preemption and the policy has not yet said what next.
WAITING, PLACING, RUNNING = "waiting", "placing", "running"
STOPPING, STOPPED = "stopping", "stopped"
FINISHED, CANCELLED, LOST, REJECTED = "finished", "cancelled", "lost", "rejected"
OVER = (FINISHED, CANCELLED, LOST, REJECTED)


@dataclass(eq=False, slots=True)
class Job:
    """A submitted job and where it stands."""

    sim: SimJob
    state: str = WAITING
    gen: int = 0  # placements so far; events for an older one are stale
    tasks: list[str] = field(default_factory=list)  # of the current placement
    placed: int = 0
    progress_s: float = 0.0  # work done, kept across a resumable preemption
    saved_s: float = 0.0  # progress at the last checkpoint
    run_start: float = 0.0
    stop_cause: StopCause = StopCause.PREEMPTED
    first_start: float | None = None
    finished: float | None = None
    preemptions: int = 0


# -- the agents' events, which the world's agenda hands back to ``BatchAgents.handle``


@dataclass(frozen=True)
class Completion:
    """A placement's work runs out."""

    job: Job
    gen: int


@dataclass(frozen=True)
class StopEnd:
    """A stop's grace is over, or the job's work ran out within it."""

    job: Job
    gen: int
    task_ids: tuple[str, ...]
    finishes: bool  # the job's work runs out within the grace: it exits 0


@dataclass(frozen=True)
class EndTask:
    """A task placed for a job that is already over exits at once."""

    task_id: str


AgentEvent = Completion | StopEnd | EndTask


class Observer:
    """What the agents count (``libs.sim.recorder.Recorder``); it ignores what it is not told."""

    def waiting(self, spec: JobSpec, delta: int) -> None:
        """``delta`` jobs of ``spec`` (negative: no longer) wait."""

    def held(self, spec: JobSpec, gpus: int) -> None:
        """``gpus`` (negative: released) of a task of ``spec``, at the current time."""

    def preempted(self, spec: JobSpec) -> None:
        """A placement of a job of ``spec`` is stopped to make room."""

    def requeued(self) -> None:
        """A stopped job waits again."""

    def lost(self, gpu_s: float) -> None:
        """Work thrown away by a preemption: ``gpu_s`` since the job's last checkpoint."""


class BatchAgents:
    """The batch jobs of a run and their running tasks, in ``world``."""

    def __init__(self, world: World, observer: Observer, checkpoint_s: float = 0.0) -> None:
        self.world = world
        self.observer = observer
        self.checkpoint_s = checkpoint_s
        self.jobs: dict[str, Job] = {}
        self.tasks: dict[str, Job] = {}  # running task -> its job
        self.waiting = 0  # jobs

    def arrive(self, sim: SimJob) -> bool:
        """A job is submitted; False for a repeated submission (the policy ignores it too)."""
        if sim.job_id in self.jobs:
            return False
        self.jobs[sim.job_id] = Job(sim)
        self.waiting += 1
        self.observer.waiting(sim.spec, 1)
        return True

    def job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise SimulationError(f"a decision names {job_id}, which was never submitted")
        return job

    # -- decisions -------------------------------------------------------------------

    def decide(self, decision: Decision) -> None:
        """Act on a batch decision; others are not the agents' business."""
        match decision:
            case Place():
                self._place(decision)
            case Stop():
                self._stop(decision)
            case Requeue(job_id=job_id):
                job = self.job(job_id)
                if job.state in (STOPPING, STOPPED):
                    self.observer.requeued()
                    self._lose_progress(job, job.saved_s if job.sim.spec.resumable else 0.0)
                    job.state = WAITING
                    self.waiting += 1
                    self.observer.waiting(job.sim.spec, 1)
            case Preempted(job_id=job_id):
                job = self.job(job_id)
                if job.state not in OVER:
                    self._lose_progress(job, 0.0)
                    self._leave_waiting(job, LOST)
            case Cancel(job_id=job_id):
                job = self.job(job_id)
                if job.state not in OVER:
                    self._leave_waiting(job, CANCELLED)
            case Reject(job_id=job_id):
                self._leave_waiting(self.job(job_id), REJECTED)

    def _place(self, place: Place) -> None:
        job = self.job(place.job_id)
        world = self.world
        world.start(place)
        now = world.now_s
        spec = job.sim.spec
        gpus = len(place.gpu_indices)
        self.tasks[place.task_id] = job
        self.observer.held(spec, gpus)
        if job.state in OVER:  # finished during a stop's grace: exits at once
            world.at(world.now, EndTask(place.task_id))
            return
        if job.state not in (PLACING, RUNNING):
            self._leave_waiting(job, PLACING)
            job.gen += 1
            job.tasks = []
            job.placed = 0
            if job.first_start is None:
                job.first_start = now
        job.tasks.append(place.task_id)
        job.placed += gpus
        if job.placed > spec.gpus:
            raise SimulationError(f"{place.job_id}: placed on {job.placed} GPUs, asked {spec.gpus}")
        if job.placed == spec.gpus:
            job.state = RUNNING
            job.run_start = now
            remaining = max(job.sim.runtime_s - job.progress_s, 0.0)
            world.at(world.units(now + remaining), Completion(job, job.gen))

    def _stop(self, stop: Stop) -> None:
        job = self.tasks.get(stop.task_id)
        if job is None:
            return  # already ended
        if job.state == STOPPING and stop.cause is StopCause.CANCELLED:
            job.stop_cause = StopCause.CANCELLED  # cancelled while being preempted
        if stop.task_id not in job.tasks or job.state not in (PLACING, RUNNING):
            return  # this placement is already stopping (a gang gets one Stop per task)
        job.stop_cause = stop.cause
        if stop.cause is StopCause.PREEMPTED:
            job.preemptions += 1
            self.observer.preempted(job.sim.spec)
        world = self.world
        now = world.now_s
        at = now + world.grace(stop.grace_s)
        finishes = False
        if job.state == RUNNING:
            ran = now - job.run_start
            every = self.checkpoint_s
            job.saved_s = job.progress_s + (ran // every * every if every else ran)
            job.progress_s += ran
            done_at = now + job.sim.runtime_s - job.progress_s
            finishes = done_at <= at
            at = min(at, done_at)
        job.state = STOPPING
        world.at(world.units(at), StopEnd(job, job.gen, tuple(job.tasks), finishes))

    # -- events ----------------------------------------------------------------------

    def handle(self, event: AgentEvent) -> None:
        """One of the events put on the world's agenda, at its time."""
        match event:
            case Completion():
                self._complete(event.job, event.gen)
            case StopEnd():
                self._stop_end(event)
            case EndTask():
                self._end_task(event.task_id, 0)

    def _complete(self, job: Job, gen: int) -> None:
        if job.gen != gen or job.state != RUNNING:
            return  # stopped since this was scheduled
        job.state = FINISHED
        job.finished = self.world.now_s
        for task_id in job.tasks:
            self._end_task(task_id, 0)

    def _stop_end(self, end: StopEnd) -> None:
        job = end.job
        task_ids = end.task_ids
        if end.finishes:
            if job.state not in OVER:
                self._leave_waiting(job, FINISHED)
                job.finished = self.world.now_s
            if job.gen != end.gen:  # placed again meanwhile: that run ends too
                task_ids += tuple(job.tasks)
        elif job.gen == end.gen and job.state == STOPPING:
            job.state = CANCELLED if job.stop_cause is StopCause.CANCELLED else STOPPED
        for task_id in task_ids:
            self._end_task(task_id, 0 if end.finishes else SIGTERM_EXIT)

    # -- bookkeeping -----------------------------------------------------------------

    def _end_task(self, task_id: str, exit_code: int) -> None:
        """Free a task's GPUs; it says it ended once the observer has counted it."""
        job = self.tasks.pop(task_id, None)
        if job is None:
            return
        task = self.world.release(task_id)
        self.observer.held(job.sim.spec, -len(task.gpus))
        self.world.announce_end(task, exit_code)

    def _leave_waiting(self, job: Job, state: str) -> None:
        if job.state == WAITING:
            self.waiting -= 1
            self.observer.waiting(job.sim.spec, -1)
        job.state = state

    def _lose_progress(self, job: Job, kept_s: float) -> None:
        """The job goes back to ``kept_s`` of progress."""
        if job.progress_s > kept_s:
            self.observer.lost((job.progress_s - kept_s) * job.sim.spec.gpus)
        job.progress_s = job.saved_s = kept_s
