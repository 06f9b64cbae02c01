"""The batch agents on their own: a scripted host that records what they ask of it."""

from __future__ import annotations

import pytest

from libs.core import JobSpec
from libs.core.decisions import Place, Preempted, Requeue, Stop, StopCause
from libs.core.inputs import TaskEnded, TaskStarted
from libs.sim.batch import (
    FINISHED,
    LOST,
    PLACING,
    RUNNING,
    SIGTERM_EXIT,
    STOPPED,
    WAITING,
    AgentEvent,
    BatchAgents,
    Task,
)
from libs.sim.workload import SimJob


class Host:
    """A clock, an event list and a record of the inputs and counts."""

    def __init__(self) -> None:
        self.now = 0.0
        self.later: list[tuple[float, AgentEvent]] = []
        self.inputs: list[TaskStarted | TaskEnded] = []
        self.counts: list[tuple[str, object]] = []
        self.free: set[tuple[str, int]] = {("n", i) for i in range(4)}

    def take_gpus(self, place: Place) -> None:
        for gpu in place.gpu_indices:
            self.free.remove((place.node_id, gpu))

    def free_gpus(self, task: Task) -> None:
        self.free.update((task.node_id, gpu) for gpu in task.gpus)

    def started(self, event: TaskStarted, task: Task) -> None:
        self.inputs.append(event)

    def ended(self, event: TaskEnded) -> None:
        self.inputs.append(event)

    def schedule(self, at: float | None, event: AgentEvent) -> None:
        self.later.append((self.now if at is None else at, event))

    def run_next(self, agents: BatchAgents) -> None:
        self.later.sort(key=lambda e: e[0])
        self.now, event = self.later.pop(0)
        agents.handle(event)

    # the observer
    def waiting(self, spec: JobSpec, delta: int) -> None:
        self.counts.append(("waiting", delta))

    def held(self, spec: JobSpec, gpus: int) -> None:
        self.counts.append(("held", gpus))

    def preempted(self, spec: JobSpec) -> None:
        self.counts.append(("preempted", 1))

    def requeued(self) -> None:
        self.counts.append(("requeued", 1))

    def lost(self, gpu_s: float) -> None:
        self.counts.append(("lost", gpu_s))


def _agents(
    gpus: int = 2, runtime: float = 100.0, *, resumable: bool = False
) -> tuple[Host, BatchAgents]:
    host = Host()
    agents = BatchAgents(host, host, stop_grace_s=30.0, error=ValueError)
    spec = JobSpec("a", "u", gpus, (), resumable=resumable)
    assert agents.arrive(SimJob(0.0, "j", spec, runtime))
    assert not agents.arrive(SimJob(0.0, "j", spec, runtime))  # a repeat is ignored
    return host, agents


def _place(agents: BatchAgents, task_id: str, gpu: int) -> Place:
    return Place("j", task_id, "n", (gpu,), agents.jobs["j"].sim.spec)


def test_a_gang_runs_once_all_its_gpus_are_placed_and_ends_after_its_runtime() -> None:
    host, agents = _agents()
    agents.decide(_place(agents, "j/0", 0))
    assert agents.jobs["j"].state == PLACING and not host.later
    host.now = 5.0
    agents.decide(_place(agents, "j/1", 1))
    assert agents.jobs["j"].state == RUNNING and agents.waiting == 0
    assert host.later[0][0] == 105.0
    host.run_next(agents)
    job = agents.jobs["j"]
    assert (job.state, job.first_start, job.finished) == (FINISHED, 0.0, 105.0)
    assert [type(i).__name__ for i in host.inputs] == ["TaskStarted"] * 2 + ["TaskEnded"] * 2
    assert len(host.free) == 4 and not agents.tasks


def test_a_stop_ends_the_placement_after_the_grace_and_a_requeue_loses_unsaved_work() -> None:
    host, agents = _agents(gpus=1)
    agents.decide(_place(agents, "j/0", 0))
    host.now = 40.0
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    assert host.later[-1][0] == 70.0
    host.later.pop(0)  # the completion, now stale
    host.run_next(agents)
    ended = host.inputs[-1]
    assert isinstance(ended, TaskEnded) and ended.exit_code == SIGTERM_EXIT
    assert agents.jobs["j"].state == STOPPED
    agents.decide(Requeue("j", "requeued"))
    assert agents.jobs["j"].state == WAITING and agents.waiting == 1
    assert ("lost", 40.0) in host.counts and ("requeued", 1) in host.counts


def test_a_job_whose_work_runs_out_within_the_grace_finishes() -> None:
    host, agents = _agents(gpus=1, runtime=50.0)
    agents.decide(_place(agents, "j/0", 0))
    host.now = 40.0
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    host.later.pop(0)
    host.run_next(agents)
    assert host.now == 50.0 and agents.jobs["j"].state == FINISHED
    ended = host.inputs[-1]
    assert isinstance(ended, TaskEnded) and ended.exit_code == 0
    agents.decide(Preempted("j", "too late"))  # over already: nothing changes
    assert agents.jobs["j"].state == FINISHED


def test_preempted_ends_a_stopped_job_and_rule_breaking_decisions_raise() -> None:
    host, agents = _agents(gpus=1)
    agents.decide(_place(agents, "j/0", 0))
    with pytest.raises(ValueError, match="placed while a task of that id runs"):
        agents.decide(_place(agents, "j/0", 1))
    with pytest.raises(ValueError, match="never submitted"):
        agents.decide(Requeue("nope", "?"))
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    host.later.pop(0)
    host.run_next(agents)
    agents.decide(Preempted("j", "not resumable"))
    assert agents.jobs["j"].state == LOST and agents.jobs["j"].preemptions == 1
