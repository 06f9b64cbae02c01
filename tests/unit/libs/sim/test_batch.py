"""The batch agents on their own, in a one-node world: what they report and count."""

from __future__ import annotations

import pytest

from libs.core import JobSpec, NodeSpec
from libs.core.decisions import Place, Preempted, Requeue, Stop, StopCause
from libs.core.inputs import Input, TaskEnded
from libs.sim.batch import (
    FINISHED,
    LOST,
    PLACING,
    RUNNING,
    STOPPED,
    WAITING,
    BatchAgents,
    Observer,
)
from libs.sim.workload import SimJob
from libs.sim.world import SIGTERM_EXIT, SimulationError, World


class Counts(Observer):
    """The observer: what the agents counted, in order."""

    def __init__(self) -> None:
        self.counts: list[tuple[str, object]] = []

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


class Host:
    """One 4-GPU node in a world; the inputs its agents reported, in order."""

    def __init__(self) -> None:
        self.world = World(stop_grace_s=30.0)
        self.world.join(NodeSpec("n", "H100", (0, 1, 2, 3), 80.0))
        self.inputs: list[Input] = []
        self.observer = Counts()
        self.counts = self.observer.counts

    @property
    def free(self) -> set[tuple[str, int]]:
        return {key for key, task in self.world.gpus.items() if task is None}

    def later(self) -> list[tuple[float, object]]:
        """What is on the agenda after the reports due now."""
        self.settle()
        return sorted((at, e) for at, _, _, e in self.world._agenda)  # type: ignore[misc]

    def settle(self) -> None:
        """Take in the reports due now."""
        world = self.world
        while world.next_at() == (world.now, 0) and isinstance(world._agenda[0][3], Input):
            self.inputs.append(world.pop())  # type: ignore[arg-type]

    def run_next(self, agents: BatchAgents) -> None:
        self.settle()
        agents.handle(self.world.pop())  # type: ignore[arg-type]
        self.settle()

    def drop_next(self) -> None:
        self.settle()
        self.world.pop()

    def at(self, now: float) -> None:
        self.settle()
        self.world.now = now


def _agents(
    gpus: int = 2, runtime: float = 100.0, *, resumable: bool = False
) -> tuple[Host, BatchAgents]:
    host = Host()
    agents = BatchAgents(host.world, host.observer)
    spec = JobSpec("a", "u", gpus, (), resumable=resumable)
    assert agents.arrive(SimJob(0.0, "j", spec, runtime))
    assert not agents.arrive(SimJob(0.0, "j", spec, runtime))  # a repeat is ignored
    return host, agents


def _place(agents: BatchAgents, task_id: str, gpu: int) -> Place:
    return Place("j", task_id, "n", (gpu,), agents.jobs["j"].sim.spec)


def test_a_gang_runs_once_all_its_gpus_are_placed_and_ends_after_its_runtime() -> None:
    host, agents = _agents()
    agents.decide(_place(agents, "j/0", 0))
    assert agents.jobs["j"].state == PLACING and not host.later()
    host.at(5.0)
    agents.decide(_place(agents, "j/1", 1))
    assert agents.jobs["j"].state == RUNNING and agents.waiting == 0
    assert host.later()[0][0] == 105.0
    host.run_next(agents)
    job = agents.jobs["j"]
    assert (job.state, job.first_start, job.finished) == (FINISHED, 0.0, 105.0)
    assert [type(i).__name__ for i in host.inputs] == ["TaskStarted"] * 2 + ["TaskEnded"] * 2
    assert len(host.free) == 4 and not agents.tasks and not host.world.tasks


def test_a_stop_ends_the_placement_after_the_grace_and_a_requeue_loses_unsaved_work() -> None:
    host, agents = _agents(gpus=1)
    agents.decide(_place(agents, "j/0", 0))
    host.at(40.0)
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    assert [at for at, _ in host.later()] == [70.0, 100.0]  # the completion is stale
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
    host.at(40.0)
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    host.drop_next()  # the completion at 50: the stop's end comes first
    host.run_next(agents)
    assert host.world.now == 50.0 and agents.jobs["j"].state == FINISHED
    ended = host.inputs[-1]
    assert isinstance(ended, TaskEnded) and ended.exit_code == 0
    agents.decide(Preempted("j", "too late"))  # over already: nothing changes
    assert agents.jobs["j"].state == FINISHED


def test_preempted_ends_a_stopped_job_and_rule_breaking_decisions_raise() -> None:
    host, agents = _agents(gpus=1)
    agents.decide(_place(agents, "j/0", 0))
    with pytest.raises(SimulationError, match="placed while a task of that id runs"):
        agents.decide(_place(agents, "j/0", 1))
    with pytest.raises(SimulationError, match="never submitted"):
        agents.decide(Requeue("nope", "?"))
    agents.decide(Stop("j", "j/0", "n", StopCause.PREEMPTED, "preempted"))
    host.run_next(agents)
    agents.decide(Preempted("j", "not resumable"))
    assert agents.jobs["j"].state == LOST and agents.jobs["j"].preemptions == 1
