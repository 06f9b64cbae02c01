"""Properties that must hold for any history (hypothesis drives a tiny cluster).

The driver plays the node agents: placed tasks start, stopped tasks end, and
running tasks end when hypothesis says so. Each property is checked after
every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core import (
    BudgetSet,
    CancelRequested,
    Decision,
    Input,
    JobArrived,
    NodeJoined,
    Place,
    Scheduler,
    Stop,
    StopCause,
    TaskEnded,
    TaskIdle,
    TaskStarted,
    Tick,
    UsageSnapshot,
)
from tests.builders import job, node, tree

ALLOCATIONS = ("a", "b", "c")


@dataclass
class Cluster:
    """The world as node agents see it, fed by the scheduler's decisions."""

    scheduler: Scheduler = field(default_factory=Scheduler)
    now: float = 0.0
    held: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, gpu) -> task
    tasks: dict[str, Place] = field(default_factory=dict)  # running task id -> placement
    started: dict[str, float] = field(default_factory=dict)  # job id -> start time
    log: list[tuple[Input, list[Decision]]] = field(default_factory=list)

    def feed(self, event: Input) -> list[Decision]:
        decisions = self.scheduler.handle(event)
        self.log.append((event, decisions))
        for d in decisions:
            if isinstance(d, Place):
                for gpu in d.gpu_indices:
                    assert (d.node_id, gpu) not in self.held, f"GPU {d.node_id}:{gpu} given twice"
                    self.held[(d.node_id, gpu)] = d.task_id
                self.tasks[d.task_id] = d
            if isinstance(d, Stop) and d.cause is StopCause.PREEMPTED:
                spec = self.tasks[d.task_id].spec
                began = self.started.get(d.job_id)
                protected = spec.allocated and (
                    began is None or self.now < began + spec.min_runtime_s
                )
                assert not protected, f"{d.job_id} preempted inside its contract"
        # Agents report starts and honour stops at once.
        for d in decisions:
            if isinstance(d, Place) and d.job_id not in self.started:
                self.started[d.job_id] = self.now
                self.feed(TaskStarted(self.now, d.job_id, d.task_id, d.node_id))
            if isinstance(d, Stop) and d.task_id in self.tasks:
                self.end(d.task_id)
        return decisions

    def end(self, task_id: str) -> None:
        place = self.tasks.pop(task_id)
        for gpu in place.gpu_indices:
            del self.held[(place.node_id, gpu)]
        self.started.pop(place.job_id, None)
        self.feed(TaskEnded(self.now, place.job_id, task_id, place.node_id))


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from([1, 1, 2, 4, 8, 16]),
            st.sampled_from(ALLOCATIONS),
            st.sampled_from([0, 0, 600, 3600]),
            st.booleans(),
        ),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("time"), st.integers(1, 7200)),
        st.tuples(st.just("idle"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("usage"), st.sampled_from(ALLOCATIONS), st.integers(0, 10**6)),
    ),
    max_size=60,
)


def play(history: list[tuple[object, ...]]) -> Cluster:
    world = Cluster()
    world.feed(BudgetSet(0, tree(a=3, b=2, c=1)))
    for i, size in enumerate([8, 8, 4]):
        world.feed(NodeJoined(0, node(f"n{i}", size)))
    arrived = 0
    usage = dict.fromkeys(ALLOCATIONS, 0.0)
    for step in history:
        kind = step[0]
        if kind == "arrive":
            _, gpus, allocation, minimum, resumable = step
            spec = job(gpus, allocation=allocation, min_runtime_s=minimum, resumable=resumable)  # type: ignore[arg-type]
            world.feed(JobArrived(world.now, f"j{arrived}", spec))
            arrived += 1
        elif kind == "end" and world.tasks:
            world.end(sorted(world.tasks)[step[1] % len(world.tasks)])  # type: ignore[operator]
        elif kind == "time":
            world.now += step[1]  # type: ignore[operator]
            world.feed(Tick(world.now))
        elif kind == "idle" and world.tasks:
            place = world.tasks[sorted(world.tasks)[step[1] % len(world.tasks)]]  # type: ignore[operator]
            world.feed(TaskIdle(world.now, place.job_id, place.task_id, True))
        elif kind == "cancel" and arrived:
            world.feed(CancelRequested(world.now, f"j{step[1] % arrived}"))  # type: ignore[operator]
        elif kind == "usage":
            usage[step[1]] = float(step[2])  # type: ignore[index, arg-type]
            world.feed(UsageSnapshot(world.now, 7 * 86400.0, tuple(sorted(usage.items()))))
    return world


@settings(max_examples=150, deadline=None)
@given(steps)
def test_no_gpu_twice_and_no_protected_job_preempted(history: list[tuple[object, ...]]) -> None:
    play(history)  # the Cluster asserts both after every decision


@settings(max_examples=60, deadline=None)
@given(steps)
def test_the_same_input_gives_the_same_output(history: list[tuple[object, ...]]) -> None:
    first, second = play(history), play(history)
    assert [d for _, d in first.log] == [d for _, d in second.log]
    assert first.scheduler.digest() == second.scheduler.digest()


@settings(max_examples=60, deadline=None)
@given(steps)
def test_no_waiting_job_starves_while_capacity_frees(history: list[tuple[object, ...]]) -> None:
    world = play(history)
    # No more arrivals: as running work ends, every job that can fit must start.
    for _ in range(200):
        if not world.tasks:
            break
        world.end(sorted(world.tasks)[0])
    world.now += 1
    world.feed(Tick(world.now))
    for _ in range(200):
        if not world.tasks:
            break
        world.end(sorted(world.tasks)[0])
    assert not world.tasks
    waiting = [j for j in world.scheduler._queues.jobs.values() if j.spec.gpus <= 16]
    assert waiting == [], f"{len(waiting)} jobs still wait on an empty cluster"
