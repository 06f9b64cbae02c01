"""Properties that must hold for any history (hypothesis drives a tiny cluster).

The simulated cluster (``libs.sim.world``) plays the node agents: placed tasks
start, stopped tasks end, and running tasks end when hypothesis says so; a task
its node lost with it is gone.
Each property is checked after every step. The hostile histories add what a
careless or malicious writer of the log could: invalid jobs and nodes, task
ends for tasks that never ran, numbers that are not finite, nodes that go silent
or restart. The tied histories are made of ties (equal shares, equal
priorities, simultaneous arrivals, equal nodes) where an order that follows set
or dict iteration, or hash randomization, would show in the decisions.

Determinism is held byte for byte by ``determinism.check_determinism``: two
runs, a replay of the recorded inputs, and a replay in another process with
another ``PYTHONHASHSEED`` (``test_determinism.py`` shows it catches planted
nondeterminism).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core import (
    BudgetSet,
    CancelRequested,
    Decision,
    Dependency,
    Input,
    JobArrived,
    JobSpec,
    NodeHeartbeat,
    NodeJoined,
    NodeSpec,
    Place,
    Scheduler,
    Stop,
    StopCause,
    TaskEnded,
    TaskIdle,
    TaskLost,
    Tick,
    UsageSnapshot,
)
from libs.sim.world import Task, World
from tests.builders import job, node, tree
from tests.unit.libs.core.determinism import OtherProcess, Recording, check_determinism, line

ALLOCATIONS = ("a", "b", "c")


# Step kinds every history generator has (``Cluster.step``).
COMMON_STEPS = frozenset({"end", "time", "idle", "cancel"})


@dataclass
class Cluster:
    """The scheduler and the simulated cluster (``libs.sim.world``): placed tasks start at
    once, stopped ones end at once, a GPU given twice raises ``SimulationError``; every
    preemption is checked against the contract."""

    scheduler: Scheduler = field(default_factory=Scheduler)
    world: World = field(default_factory=lambda: World(stop_grace_s=0.0))
    started: dict[str, float] = field(default_factory=dict)  # job id -> start time
    log: list[tuple[Input, list[Decision], bytes]] = field(default_factory=list)  # + digest

    @property
    def now(self) -> float:
        return self.world.now

    @now.setter
    def now(self, at: float) -> None:
        self.world.now = at

    @property
    def tasks(self) -> dict[str, Task]:
        return self.world.tasks

    def feed(self, event: Input) -> list[Decision]:
        """``event``, then what the node agents report because of it."""
        decisions = self._decide(event)
        self._settle()
        return decisions

    def end(self, task_id: str, exit_code: int = 0) -> None:
        self.world.end(task_id, exit_code)
        self._settle()

    def step(self, step: tuple[object, ...], arrived: int) -> None:
        """A step the generators share: a task ends, time passes, a task idles, one of the
        ``arrived`` jobs is cancelled (each a no-op when there is nothing to act on)."""
        kind, pick = step[0], int(str(step[1]))
        tasks = sorted(self.tasks)
        if kind == "end" and tasks:
            self.end(tasks[pick % len(tasks)])
        elif kind == "time":
            self.now += pick
            self.feed(Tick(self.now))
        elif kind == "idle" and tasks:
            place = self.tasks[tasks[pick % len(tasks)]]
            self.feed(TaskIdle(self.now, place.job_id, place.task_id, True))
        elif kind == "cancel" and arrived:
            self.feed(CancelRequested(self.now, f"j{pick % arrived}"))

    def _settle(self) -> None:
        world = self.world
        while (due := world.next_at()) is not None and due[0] <= world.now:
            entry = world.pop()
            if not world.handle(entry):
                self._decide(entry)  # type: ignore[arg-type]

    def _decide(self, event: Input) -> list[Decision]:
        if isinstance(event, NodeJoined):
            self.world.join(event.node)
        if isinstance(event, TaskEnded):
            self.started.pop(event.job_id, None)
        decisions = self.scheduler.handle(event)
        self.log.append((event, decisions, self.scheduler.digest()))
        for d in decisions:
            if isinstance(d, Place):
                self.world.start(d)
                self.started.setdefault(d.job_id, self.now)
            if isinstance(d, TaskLost) and d.task_id in self.tasks:  # gone with its node
                self.started.pop(self.world.release(d.task_id).job_id, None)
            if isinstance(d, Stop) and d.cause is StopCause.PREEMPTED:
                spec = self.tasks[d.task_id].spec
                began = self.started.get(d.job_id)
                # Work placed beyond its allocation's share is not protected (the rule
                # itself: test_contract.py and test_budget_policy.py).
                borrowed = self.scheduler._facts.running.jobs[d.job_id].borrowed
                protected = (
                    spec.allocated
                    and not borrowed
                    and (began is None or self.now < began + spec.min_runtime_s)
                )
                assert not protected, f"{d.job_id} preempted inside its contract"
        for d in decisions:
            if isinstance(d, Stop):
                self.world.stop(d.task_id, d.grace_s)
        return decisions

    def recording(self) -> Recording:
        return Recording(
            tuple(event for event, _, _ in self.log),
            tuple(line(decisions, digest) for _, decisions, digest in self.log),
        )


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
        # A job on named nodes, with a time limit, after an earlier job; a part that fails.
        st.tuples(
            st.just("linked"),
            st.sampled_from([1, 2, 4]),  # GPUs a part
            st.sampled_from([0, 2]),  # nodes
            st.sampled_from([0, 0, 600]),  # time limit
            st.integers(0, 50),  # which earlier job it waits for
            st.sampled_from([None, False, True]),  # no dependency, :ok, :any
        ),
        st.tuples(st.just("fail"), st.integers(0, 50)),
    ),
    max_size=60,
)


def play(history: list[tuple[object, ...]], scheduler: Scheduler | None = None) -> Cluster:
    world = Cluster(scheduler or Scheduler())
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
        elif kind == "linked":
            _, per, nodes, limit, pick, any_end = step
            after = (
                ()
                if any_end is None or not arrived
                else (Dependency(f"j{pick % arrived}", any_end),)
            )  # type: ignore[operator]
            spec = job(
                per * max(nodes, 1),  # type: ignore[operator]
                allocation="a",
                nodes=nodes,
                time_limit_s=limit,
                after=after,
                min_runtime_s=600 if per > 1 else 0,  # charged: it may preempt
                resumable=per == 2,
            )
            world.feed(JobArrived(world.now, f"j{arrived}", spec))
            arrived += 1
        elif kind == "fail" and world.tasks:
            tasks = sorted(world.tasks)
            world.end(tasks[int(str(step[1])) % len(tasks)], exit_code=1)
        elif kind in COMMON_STEPS:
            world.step(step, arrived)
        elif kind == "usage":
            usage[step[1]] = float(step[2])  # type: ignore[index, arg-type]
            world.feed(UsageSnapshot(world.now, 7 * 86400.0, tuple(sorted(usage.items()))))
    return world


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
    waiting = [j for j in world.scheduler._facts.queues.jobs.values() if j.spec.gpus <= 16]
    assert waiting == [], f"{len(waiting)} jobs still wait on an empty cluster"
    # Every dependency has ended: its dependents started (and ended) or were cancelled.
    assert not world.scheduler._facts.dependencies.blocked


# -- hostile histories ---------------------------------------------------------

finite_or_not = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 60.0])
)
any_spec = st.builds(
    JobSpec,
    allocation=st.sampled_from(["a", "b", "", "no-such-team"]),
    user=st.sampled_from(["alice", ""]),
    gpus=st.integers(-2, 2000),
    command=st.sampled_from([(), ("true",), ("a\0b",), ("x" * 70_000,)]),
    min_runtime_s=st.sampled_from([0, 600, 10**7]),
    resumable=st.booleans(),
    gpu_type=st.sampled_from(["", "H100", "T4"]),
    simulated_duration_s=finite_or_not,
    simulated_utilization=finite_or_not,
    min_gpu_memory_gib=finite_or_not,
)
any_node = st.builds(
    NodeSpec,
    node_id=st.sampled_from(["n0", "n1", "n9", ""]),
    gpu_type=st.sampled_from(["H100", "T4"]),
    gpu_indices=st.lists(st.integers(-1, 70), max_size=70).map(tuple),
    gpu_memory_gib=finite_or_not,
)
hostile_steps = st.lists(
    st.one_of(
        st.tuples(st.just("job"), any_spec, st.sampled_from(["", "j", "j" * 80, "dup"])),
        st.tuples(st.just("arrive"), st.sampled_from([1, 2, 8, 16]), st.sampled_from(ALLOCATIONS)),
        st.tuples(st.just("node"), any_node, st.sampled_from(["", "one", "two"]), finite_or_not),
        st.tuples(st.just("stray"), st.sampled_from(["j0/0", "ghost/3", "j1/0.1"])),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("time"), st.integers(1, 25)),
        st.tuples(st.just("silence"), st.sampled_from(["n0", "n1"])),
        st.tuples(st.just("restart"), st.sampled_from(["n0", "n1"])),
        st.tuples(st.just("usage"), finite_or_not),
    ),
    max_size=60,
)


def play_hostile(history: list[tuple[object, ...]], scheduler: Scheduler | None = None) -> Cluster:
    """Two nodes that heartbeat every time step until silenced, one that never does."""
    world = Cluster(scheduler or Scheduler())
    world.feed(BudgetSet(0, tree(a=3, b=2, c=1)))
    incarnation = {"n0": "one", "n1": "one"}
    for node_id, inc in incarnation.items():
        world.feed(NodeJoined(0, node(node_id, 8), inc, heartbeat_s=5))
    world.feed(NodeJoined(0, node("n2", 4)))
    beating = set(incarnation)
    arrived = 0
    for step in history:
        kind = step[0]
        if kind == "job":
            _, spec, job_id = step
            world.feed(JobArrived(world.now, str(job_id) or "", spec))  # type: ignore[arg-type]
        elif kind == "arrive":
            _, gpus, allocation = step
            world.feed(JobArrived(world.now, f"j{arrived}", job(gpus, allocation=allocation)))  # type: ignore[arg-type]
            arrived += 1
        elif kind == "node":
            _, spec, agent, beat = step
            world.feed(NodeJoined(world.now, spec, agent, beat))  # type: ignore[arg-type]
        elif kind == "stray":
            # A report from a node the task is not on: never believed.
            world.feed(TaskEnded(world.now, str(step[1]).split("/")[0], str(step[1]), "n9"))
        elif kind in ("end", "cancel"):
            world.step(step, arrived)
        elif kind == "time":
            world.now += step[1]  # type: ignore[operator]
            for node_id in sorted(beating):
                world.feed(NodeHeartbeat(world.now, node_id, incarnation[node_id]))
            world.feed(Tick(world.now))
        elif kind == "silence":
            beating.discard(str(step[1]))
        elif kind == "restart":
            node_id = str(step[1])
            incarnation[node_id] += "+"
            beating.add(node_id)
            # The new agent killed what the old one ran: placement says which (TaskLost).
            world.feed(NodeJoined(world.now, node(node_id, 8), incarnation[node_id], 5))
        elif kind == "usage":
            world.feed(UsageSnapshot(world.now, 7 * 86400.0, (("a", step[1]),)))  # type: ignore[arg-type]
    return world


# -- tied histories ------------------------------------------------------------

TIED = ("a", "b", "c", "d")  # equal weights: equal shares until usage tells them apart
simultaneous = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from(TIED),
        st.sampled_from([0, 600, 3600]),
        st.sampled_from([0, 0, 1]),  # priority
        st.booleans(),  # resumable
    ),
    min_size=1,
    max_size=6,
)
tied_steps = st.lists(
    st.one_of(
        st.tuples(st.just("burst"), simultaneous),
        st.tuples(st.just("node"), st.sampled_from(["n3", "n1", "n2", "n0"])),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("ends"), st.integers(1, 4)),  # several tasks end at the same time
        st.tuples(st.just("time"), st.sampled_from([1, 10, 600, 3600])),
        st.tuples(st.just("idle"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("usage"), st.sampled_from([0, 3600, 7200])),  # the same for all
    ),
    max_size=40,
)


def play_tied(history: list[tuple[object, ...]], scheduler: Scheduler | None = None) -> Cluster:
    """Equal allocations, equal 8-GPU nodes that join when the history says (jobs
    may queue up before any node exists), bursts of arrivals at one instant."""
    world = Cluster(scheduler or Scheduler())
    world.feed(BudgetSet(0, tree(**dict.fromkeys(TIED, 1.0))))
    arrived = 0
    for step in history:
        kind = step[0]
        if kind == "burst":
            for gpus, allocation, minimum, priority, resumable in step[1]:  # type: ignore[attr-defined]
                spec = job(
                    gpus,
                    allocation=allocation,
                    min_runtime_s=minimum,
                    priority=priority,
                    resumable=resumable,
                )
                world.feed(JobArrived(world.now, f"j{arrived}", spec))
                arrived += 1
        elif kind == "node":
            world.feed(NodeJoined(world.now, node(str(step[1]), 8)))
        elif kind in COMMON_STEPS:
            world.step(step, arrived)
        elif kind == "ends":
            for task_id in sorted(world.tasks)[: int(str(step[1]))]:
                world.end(task_id)
        elif kind == "usage":
            usage = tuple((allocation, float(step[1])) for allocation in TIED)  # type: ignore[arg-type]
            world.feed(UsageSnapshot(world.now, 7 * 86400.0, usage))
    return world


# -- every kind of history -------------------------------------------------------

# How each kind is generated, and played on a Cluster (by default on a new Scheduler).
HISTORIES: dict[str, tuple[st.SearchStrategy[list[tuple[object, ...]]], Callable[..., Cluster]]] = {
    "random": (steps, play),
    "hostile": (hostile_steps, play_hostile),
    "tied": (tied_steps, play_tied),
}


def for_histories(
    kind: str, examples: int, check: Callable[[list[tuple[object, ...]]], object]
) -> None:
    """``check`` on up to ``examples`` histories of the kind; hypothesis shrinks the first
    that fails."""

    @settings(max_examples=examples, deadline=None)
    @given(HISTORIES[kind][0])
    def each(history: list[tuple[object, ...]]) -> None:
        check(history)

    each()


@pytest.mark.parametrize(("kind", "examples"), [("random", 150), ("hostile", 300), ("tied", 30)])
def test_no_gpu_twice_no_protected_job_preempted_and_nothing_raised(
    kind: str, examples: int
) -> None:
    for_histories(kind, examples, HISTORIES[kind][1])  # the Cluster asserts after every decision


@pytest.mark.parametrize(("kind", "examples"), [("random", 60), ("hostile", 100), ("tied", 100)])
def test_the_same_history_gives_the_same_decisions_byte_for_byte_in_any_process(
    kind: str, examples: int, other_process: OtherProcess
) -> None:
    played = HISTORIES[kind][1]

    def replays_identically(history: list[tuple[object, ...]]) -> None:
        divergence = check_determinism(
            lambda: played(history).recording(), elsewhere=[other_process]
        )
        assert divergence is None, str(divergence)

    for_histories(kind, examples, replays_identically)
