"""Record the golden logs: ``python -m tests.golden.record`` (rerun when POLICY_VERSION changes).

A scenario is a small simulated cluster around the scheduler: admission
submits jobs, node agents start and end the tasks placement places (and stop
the ones it stops), users cancel, managers change the budget, the ticker and
the projector report time and usage. The tasks run in the simulators' cluster
(``libs.sim.world``): it holds batch tasks' GPUs, refuses a GPU given twice, starts
a batch task a second after its placement and ends it two seconds after a stop;
workflow tasks queue on their GPU, which loads and evicts models, and a batch task
evicts the models cached on the GPUs it takes. What the world reports is written as
the node agent writes it (``services.node_agent.lifecycle``); its agenda orders every
record, to the millisecond. Every id, timestamp and choice comes from the seed, so a
scenario is the same log on every run. Each input goes through :func:`decide` as
placement would, and the decisions are recorded.

Next to each log, a sidecar JSON names its files and the policy that decided
it; tampered copies of the decisions name the divergence the audit must find.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    POLICY,
    POLICY_VERSION,
    Input,
    JobId,
    ModelEvicted,
    ModelLoaded,
    NodeId,
    Place,
    PolicyConfig,
    Scheduler,
    TaskEnded,
    TaskId,
    TaskRefused,
    TaskStarted,
    simulated,
)
from libs.core.compass import Eviction
from libs.core.simulated import SimulatedRun
from libs.events import event_type, new_envelope, wire_time
from libs.events.convert import node_from_proto, serving_from_proto, spec_from_proto
from libs.events.log_step import decide, policy_configured
from libs.events.logfile import write_log
from libs.sim.world import World
from services.node_agent.lifecycle import model_evicted, model_loaded, refused

HERE = Path(__file__).resolve().parent
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TICK_S = 60.0
HEARTBEAT_S = 10.0
USAGE_EVERY_S = 3600.0
GIB = 1 << 30
STOPPED = -15  # the exit code of a task stopped by SIGTERM
# What the recorded decisions name as their release: fixed, so the logs do not change
# with every commit (an audit leaves it out of the comparison).
RELEASE = "0.1.0+golden"

ALLOCATIONS = {"vision": ("alice", "dana"), "nlp": ("bob",), "speech": ("erin",)}
NODES = (("h100-0", "H100", 8, 80), ("h100-1", "H100", 8, 80), ("a100-0", "A100", 4, 40))


# Workflows of models large enough that GPUs must evict (sizes in MB, times in ms).
WORKFLOWS = (
    ("caption", (("see", "vit-20g", 20_000, 300, ()), ("say", "tts-24g", 24_000, 120, ("see",)))),
    (
        "translate",
        (
            ("draft", "llm-30g", 30_000, 560, ()),
            ("fr", "mt-12g", 12_000, 440, ("draft",)),
            ("de", "mt-12g", 12_000, 420, ("draft",)),
            ("merge", "", 0, 1, ("fr", "de")),
        ),
    ),
)


@dataclass(frozen=True)
class _Record:
    """An input record a producer writes at its time."""

    producer: str
    message: Message


@dataclass(frozen=True)
class Step:
    """One input record and the decisions placement made for it."""

    offset: int
    input: events_pb2.Envelope
    decisions: list[events_pb2.Envelope]


def budget_tree(version: int, vision_weight: float) -> types_pb2.BudgetTree:
    leaves = [
        types_pb2.BudgetNode(name=name, parent="lab", weight=weight, members=list(members))
        for (name, members), weight in zip(
            ALLOCATIONS.items(), (vision_weight, 30.0, 10.0), strict=True
        )
    ]
    root = types_pb2.BudgetNode(name="lab", weight=1.0, managers=["carol"])
    return types_pb2.BudgetTree(nodes=[root, *leaves], version=version)


def job_spec(rng: random.Random, cluster: str) -> types_pb2.JobSpec:
    allocation = rng.choice(sorted(ALLOCATIONS))
    gpu_type = rng.choice(("", "", "H100", "A100"))
    # Within what the nodes have (A100 nodes have 4): jobs that can never fit
    # would only pile up in the queue.
    gpus = rng.choice((1, 1, 1, 2, 2, 4) if gpu_type == "A100" else (1, 1, 1, 2, 2, 4, 8, 12))
    command = rng.choice((["true"], ["false"], ["python", "train.py"], ["sleep", "0.5"]))
    spec = types_pb2.JobSpec(
        allocation=allocation,
        user=rng.choice(ALLOCATIONS[allocation]),
        gpus=gpus,
        gpu_type=gpu_type,
        min_runtime=wire_time.duration(rng.choice((0, 0, 300, 900, 3600, 4 * 3600))),
        resumable=rng.random() < 0.4,
        command=command,
        priority=rng.choice((0, 0, 1, 5)),
        cluster=cluster,
    )
    run = SimulatedRun(
        duration_s=round(rng.uniform(20, 1200), 1),
        exit_code=0 if command != ["false"] else 1,
        utilization=rng.choice((0.9, 0.9, 0.02)),
    )
    spec.env.update(simulated.to_env(run))
    return spec


def workflow_spec(rng: random.Random, cluster: str) -> types_pb2.JobSpec:
    name, tasks = rng.choice(WORKFLOWS)
    workflow = types_pb2.Workflow(
        name=name,
        tasks=[
            types_pb2.WorkflowTask(
                task_id=task_id,
                model=model,
                model_mb=size,
                run_duration=wire_time.duration_ms(run_ms),
                in_kb=rng.choice((2, 300, 3000)),
                out_kb=2,
                parents=list(parents),
            )
            for task_id, model, size, run_ms, parents in tasks
        ],
    )
    return types_pb2.JobSpec(
        allocation="speech",
        user="erin",
        gpus=1,
        cluster=cluster,
        workflow=workflow,
        env=simulated.to_env(SimulatedRun(utilization=0.9)),
    )


class Scenario:
    """The simulated world around one input partition, driven by a seeded generator."""

    def __init__(
        self,
        seed: int,
        jobs: int,
        *,
        partition: int = 0,
        cluster: str = "default",
        arrival_s: float = 45.0,
        config: PolicyConfig | None = None,
        workflow_bursts: float = 0.0,
        liveness: bool = False,
    ) -> None:
        config = config or PolicyConfig()
        self._rng = random.Random(seed)
        self._jobs = jobs
        self._partition = partition
        self._cluster = cluster
        self._arrival_s = arrival_s
        self._scheduler = Scheduler(config)
        # The chance that an arrival is a burst of workflows rather than a batch job.
        self._workflow_bursts = workflow_bursts
        self._window_s = config.lookback_window_s
        # Records at equal times go in the order they were made. What the world reports
        # at once (a stop's end, a workflow task's end, the models a GPU evicts for the
        # task it takes) is written next, before anything else.
        self._reports: list[Input] = []
        self._world = World(
            start_delay_s=1.0,
            stop_grace_s=2.0,
            stopped_exit=STOPPED,
            host_to_gpu_mb_per_ms=config.host_to_gpu_mb_per_ms,
            deliver=self._reports.append,
            digits=3,
        )
        self._pids: dict[str, int] = {}
        self._live: dict[str, events_pb2.TaskPlaced] = {}  # task id -> placement
        self._started: dict[str, float] = {}
        self._charged: dict[str, float] = dict.fromkeys(sorted(ALLOCATIONS), 0.0)
        # Nodes heartbeat; one falls silent for good, one's agent restarts, and a few
        # records break the rules as a careless or hostile writer would.
        self._liveness = liveness
        self._incarnations = {node_id: "a" for node_id, *_ in NODES}
        self._silent: set[str] = set()

    def steps(self) -> Iterator[Step]:
        self._plan()
        offset = 0
        world = self._world
        while world:
            entry = world.pop()
            at = world.now
            records = self._records(entry)
            while records:
                record = records.pop(0)
                payload = record.message
                if not self._still_happens(at, payload):
                    continue
                env = new_envelope(
                    payload,
                    producer=record.producer,
                    cluster=self._cluster,
                    correlation_id=getattr(payload, "job_id", ""),
                    occurred=T0 + timedelta(seconds=at),
                    event_id=f"{self._cluster}-{self._partition}-{offset:07d}",
                )
                decisions = decide(
                    self._scheduler,
                    env,
                    partition=self._partition,
                    offset=offset,
                    release=RELEASE,
                )
                for decision in decisions:
                    self._react(at, decision)
                yield Step(offset, env, decisions)
                offset += 1
                records += self._reported()  # a GPU took a workflow task it was sent

    def _records(self, entry: object) -> list[_Record]:
        """The records an agenda entry makes: its own, or the node agent's for what the
        world did (a task started, a model loaded, a task ended)."""
        if isinstance(entry, _Record):
            return [entry]
        if isinstance(entry, Input):  # reported at its time
            return [self._written(entry)]
        if not self._world.handle(entry):
            raise TypeError(f"unknown agenda entry {entry!r}")
        return self._reported()

    def _reported(self) -> list[_Record]:
        """What the world reported at once, as records."""
        records = [self._written(report) for report in self._reports]
        self._reports.clear()
        return records

    def _written(self, report: Input) -> _Record:
        """A report of the world as the node agent writes it."""
        world = self._world
        message: Message
        match report:
            case TaskStarted(at=at, task_id=task_id):
                self._started[task_id] = at
                message = events_pb2.TaskStarted(**_ids(report), pid=self._pids.pop(task_id))
            case TaskEnded(exit_code=0):  # a workflow task's run is over
                message = events_pb2.TaskFinished(**_ids(report), exit_code=0)
            case TaskEnded(exit_code=code):  # a stop's grace is over
                message = events_pb2.TaskFailed(
                    **_ids(report), exit_code=code, reason="killed by SIGTERM"
                )
            case ModelLoaded(node_id=node_id, gpu_index=index):
                begun = world.workers[(node_id, index)].running
                assert begun is not None  # the task it loaded for starts now
                message = model_loaded(self._live[begun.task_id], index, begun)
            case ModelEvicted(node_id=node_id, gpu_index=index, model=model):
                message = model_evicted(node_id, index, self._eviction(node_id, index, model))
            case TaskRefused(task_id=task_id, gpu_index=index, wait_ms=wait):
                self._pids.pop(task_id)  # never started: placement sends it anew
                message = refused(self._live.pop(task_id), index, wait)
            case _:
                raise TypeError(f"unexpected report {report!r}")
        return _Record("node-agent", message)

    def _eviction(self, node_id: str, index: int, model: str) -> Eviction:
        """Why a model left its GPU: room for the workflow task the GPU took, or the GPU
        taken by a batch task (its worker then runs nothing)."""
        begun = self._world.workers[(node_id, index)].running
        if begun is not None:
            return next(e for e in begun.evicted if e.model == model)
        holder = self._world.gpus[(node_id, index)]
        assert holder is not None
        return Eviction(model, 0.0, f"GPU taken by batch job {self._world.tasks[holder].job_id}")

    def _at(self, at: float, producer: str, payload: Message) -> None:
        self._world.at(at, _Record(producer, payload))

    def _plan(self) -> None:
        self._at(0.0, "budget", events_pb2.BudgetChanged(tree=budget_tree(1, 60.0)))
        for node in NODES:
            self._at(0.5, "node-agent", self._registered(self._inventory(node)))
            if self._liveness:
                self._at(HEARTBEAT_S, "node-agent", events_pb2.NodeHeartbeat(node_id=node[0]))
        self._at(TICK_S, "ticker", events_pb2.ClockTick())
        self._at(USAGE_EVERY_S, "projector", events_pb2.UsageSnapshot())
        self._arrive(1.0, 0)

    def _arrive(self, at: float, number: int) -> None:
        """Plan one job's submission (and, sometimes, its cancel); each plans the next."""
        rng = self._rng
        job_id = f"job-{self._partition}-{number:07d}"
        if self._workflow_bursts and rng.random() < self._workflow_bursts:
            for extra in range(rng.randint(1, 6)):
                spec = workflow_spec(rng, self._cluster)
                submitted = events_pb2.JobSubmitted(job_id=f"{job_id}-w{extra}", spec=spec)
                self._at(at + extra * 0.05, "admission", submitted)
            self._next(at, number)
            return
        spec = job_spec(rng, self._cluster)
        self._at(at, "admission", events_pb2.JobSubmitted(job_id=job_id, spec=spec))
        if rng.random() < 0.06:
            cancel = events_pb2.JobCancelRequested(job_id=job_id, requested_by=spec.user)
            self._at(at + rng.uniform(5, 900), "admission", cancel)
        if number == self._jobs // 2:
            self._at(at, "budget", events_pb2.BudgetChanged(tree=budget_tree(2, 20.0)))
        if self._liveness:
            self._disturb(at, number)

    def _disturb(self, at: float, number: int) -> None:
        """The liveness scenario's events, at fixed points of its run."""
        if number == self._jobs // 4:
            self._silent.add("h100-1")  # its agent dies and never comes back
            bad = types_pb2.JobSpec(allocation="nlp", user="bob", gpus=0, command=["true"])
            self._at(at, "admission", events_pb2.JobAdmitted(job_id="cpu-only", spec=bad))
        if number == self._jobs // 2:
            node = types_pb2.NodeInventory(node_id="empty-0", cluster=self._cluster)
            self._at(at, "node-agent", events_pb2.NodeRegistered(inventory=node))
            tree = budget_tree(3, math.nan)
            self._at(at, "budget", events_pb2.BudgetChanged(tree=tree))
        if number == 3 * self._jobs // 4:
            # The agent of a100-0 restarts: what it ran is gone, it registers anew.
            self._incarnations["a100-0"] = "b"
            for task_id, placed in list(self._live.items()):
                if placed.node_id == "a100-0":
                    del self._live[task_id]
                    self._release(task_id)
            inventory = self._inventory(next(n for n in NODES if n[0] == "a100-0"))
            self._at(at, "node-agent", self._registered(inventory))

    def _inventory(self, node: tuple[str, str, int, int]) -> types_pb2.NodeInventory:
        node_id, gpu_type, count, memory = node
        gpus = [
            types_pb2.Gpu(index=i, uuid=f"{node_id}-{i}", type=gpu_type, memory_bytes=memory * GIB)
            for i in range(count)
        ]
        return types_pb2.NodeInventory(
            node_id=node_id,
            cluster=self._cluster,
            gpus=gpus,
            executor=types_pb2.EXECUTOR_SIMULATED,
            source="declared",
        )

    def _registered(self, inventory: types_pb2.NodeInventory) -> events_pb2.NodeRegistered:
        if not self._liveness:
            return events_pb2.NodeRegistered(inventory=inventory)
        incarnation = self._incarnations[inventory.node_id]
        return events_pb2.NodeRegistered(
            inventory=inventory,
            incarnation=incarnation,
            heartbeat_interval=wire_time.duration(HEARTBEAT_S),
        )

    def _still_happens(self, at: float, payload: Message) -> bool:
        """Fill in what depends on the moment, plan what follows, drop what a stop overtook."""
        match payload:
            case events_pb2.JobSubmitted():
                admitted = events_pb2.JobAdmitted(job_id=payload.job_id, spec=payload.spec)
                self._at(at, "admission", admitted)
                if not payload.spec.HasField("workflow"):
                    self._next(at, int(payload.job_id.rsplit("-", 1)[1]))
            case events_pb2.ClockTick() | events_pb2.UsageSnapshot() if not self._busy():
                return False
            case events_pb2.ClockTick():
                self._at(at + TICK_S, "ticker", events_pb2.ClockTick())
            case events_pb2.NodeHeartbeat() if payload.node_id in self._silent or not self._busy():
                return False
            case events_pb2.NodeHeartbeat():
                payload.incarnation = self._incarnations[payload.node_id]
                beat = events_pb2.NodeHeartbeat(node_id=payload.node_id)
                self._at(at + HEARTBEAT_S, "node-agent", beat)
            case events_pb2.NodeRegistered():
                self._world.join(node_from_proto(payload.inventory))
            case events_pb2.UsageSnapshot():
                self._at(at + USAGE_EVERY_S, "projector", events_pb2.UsageSnapshot())
                payload.window.CopyFrom(wire_time.duration(self._window_s))
                payload.usage.extend(
                    types_pb2.AllocationUsage(allocation=name, allocated_gpu_s=round(used, 3))
                    for name, used in sorted(self._charged.items())
                )
            case events_pb2.TaskStarted() | events_pb2.TaskIdle():
                return payload.task_id in self._live
            case events_pb2.TaskFinished() | events_pb2.TaskFailed():
                # Once placement stops a task, only the stop's outcome (the world's) ends it.
                task_id = payload.task_id
                if task_id in self._world.stopping or task_id not in self._live:
                    return False
                self._release(task_id)  # a batch task's own end: its GPUs are free
                placed = self._live.pop(task_id)
                started = self._started.pop(payload.task_id, at)
                if placed.spec.HasField("min_runtime") or placed.HasField("serving"):
                    used = len(placed.gpu_indices) * (at - started)
                    self._charged[placed.spec.allocation] += used
        return True

    def _next(self, at: float, number: int) -> None:
        if number + 1 < self._jobs:
            self._arrive(at + self._rng.expovariate(1 / self._arrival_s), number + 1)

    def _release(self, task_id: str) -> None:
        """A batch task is gone (ended, or lost with its node): its GPUs are free. A
        workflow task keeps its place in its GPU's queue, as an agent's queue does."""
        task = self._world.tasks.get(task_id)
        if task is not None and not task.serving:
            self._world.release(task_id)

    def _busy(self) -> bool:
        periodic = events_pb2.ClockTick | events_pb2.UsageSnapshot | events_pb2.NodeHeartbeat
        return bool(self._live) or any(
            not (isinstance(entry, _Record) and isinstance(entry.message, periodic))
            for entry in self._world.entries()
        )

    def _react(self, at: float, decision: events_pb2.Envelope) -> None:
        """What the node agents do with placement's decisions."""
        kind = event_type(decision)
        if kind == "task_placed":
            placed = decision.task_placed
            self._live[placed.task_id] = placed
            self._pids[placed.task_id] = 4000 + self._world.made
            gpus = tuple(placed.gpu_indices)
            spec = spec_from_proto(placed.spec)
            place = Place(
                JobId(placed.job_id), TaskId(placed.task_id), NodeId(placed.node_id), gpus, spec
            )
            if placed.HasField("serving"):
                serving = serving_from_proto(placed.serving)
                self._world.send(dataclasses.replace(place, serving=serving))
                return
            self._world.start(place)
            ids = _ids(placed)
            start = at + 1.0
            run, _ = simulated.split_env(placed.spec.env)
            if run.utilization < 0.1:
                self._at(
                    start + 120,
                    "node-agent",
                    events_pb2.TaskIdle(**ids, idle=True, utilization=0.02),
                )
            end = start + run.duration_s
            code = run.exit_code
            outcome: Message = (
                events_pb2.TaskFinished(**ids, exit_code=0)
                if code == 0
                else events_pb2.TaskFailed(**ids, exit_code=code, reason=f"exited with code {code}")
            )
            self._at(end, "node-agent", outcome)
        elif kind == "task_lost":
            self._live.pop(decision.task_lost.task_id, None)
            self._release(decision.task_lost.task_id)
        elif kind == "task_stop_requested" and decision.task_stop_requested.task_id in self._live:
            stop = decision.task_stop_requested
            self._world.stop(stop.task_id, wire_time.seconds(stop.grace))


def _ids(task: TaskStarted | TaskEnded | events_pb2.TaskPlaced) -> dict[str, str]:
    return {"job_id": task.job_id, "task_id": task.task_id, "node_id": task.node_id}


# name: (seed, jobs, mean seconds between arrivals, chance an arrival is a workflow burst)
SCENARIOS = {
    # Light load: most jobs start at once; cancels, gangs, idle tasks, failures.
    "scheduler-basic": (7, 120, 45.0, 0.0),
    # Arrivals outpace the nodes: queues, fair share between allocations, preemption.
    "scheduler-contended": (11, 160, 8.0, 0.0),
    # Batch work and bursts of workflows share the nodes: plans, adjustments, model
    # loads and evictions, serving GPUs going back to batch work.
    "serving-mixed": (13, 200, 10.0, 0.5),
}
# Nodes heartbeat; one goes silent and is declared lost, one's agent restarts; a job
# with no GPUs, a node with none and a budget tree with a NaN weight are answered.
LIVENESS = ("scheduler-liveness", (17, 80, 20.0, 0.0))
TAMPERED_FROM = "scheduler-contended"


def record(
    name: str, seed: int, jobs: int, arrival_s: float, bursts: float, *, liveness: bool = False
) -> list[Step]:
    scenario = Scenario(seed, jobs, arrival_s=arrival_s, workflow_bursts=bursts, liveness=liveness)
    steps = list(scenario.steps())
    write_log(HERE / f"{name}.input.bin", (step.input for step in steps))
    decisions = [d for step in steps for d in step.decisions]
    # Placement names its knobs before its first decision; the audit checks them.
    first = next(step for step in steps if step.decisions)
    configured = policy_configured(
        PolicyConfig(), first.input, partition=0, offset=first.offset, release=RELEASE
    )
    _write(name, name, [configured, *decisions], expect=None)
    return steps


def tamper(name: str, steps: list[Step]) -> None:
    """Two recordings of the same input that the audit must reject, at a known place."""
    decisions = _numbered(steps)
    _changed(name, "gpu-changed", decisions, "task_placed", _other_gpu, "task_placed.gpu_indices")
    # One followed by another of the same input: the audit must tell a gap from a change.
    offset, index, dropped = next(
        e for e, after in itertools.pairwise(decisions[len(decisions) // 2 :]) if e[0] == after[0]
    )
    _write(
        f"{name}-decision-dropped",
        name,
        [d for _, _, d in decisions if d is not dropped],
        expect={"input_offset": offset, "index": index, "difference": "MISSING"},
    )


def tamper_plan(name: str, steps: list[Step]) -> None:
    """A workflow plan moved to another GPU: replaying plans must catch it too."""
    decisions = _numbered(steps)
    kind = "workflow_planned"
    _changed(name, "plan-changed", decisions, kind, _other_plan_gpu, "workflow_planned.tasks")


def _numbered(steps: list[Step]) -> list[tuple[int, int, events_pb2.Envelope]]:
    """Every decision with its input's offset and its place among that input's decisions."""
    return [(step.offset, i, d) for step in steps for i, d in enumerate(step.decisions)]


def _changed(
    name: str,
    suffix: str,
    decisions: list[tuple[int, int, events_pb2.Envelope]],
    kind: str,
    change: Callable[[events_pb2.Envelope], None],
    field: str,
) -> None:
    """The decisions with the first of ``kind`` in their second half changed in ``field``."""
    offset, index, original = next(
        entry for entry in decisions[len(decisions) // 2 :] if event_type(entry[2]) == kind
    )
    changed = events_pb2.Envelope()
    changed.CopyFrom(original)
    change(changed)
    _write(
        f"{name}-{suffix}",
        name,
        [changed if d is original else d for _, _, d in decisions],
        expect={"input_offset": offset, "index": index, "difference": "PAYLOAD"},
        fields=[field],
    )


def _other_gpu(placed: events_pb2.Envelope) -> None:
    placed.task_placed.gpu_indices[0] ^= 1


def _other_plan_gpu(planned: events_pb2.Envelope) -> None:
    planned.workflow_planned.tasks[0].gpu_index ^= 1


def _write(
    name: str,
    input_name: str,
    decisions: list[events_pb2.Envelope],
    expect: dict[str, object] | None,
    fields: list[str] | None = None,
) -> None:
    write_log(HERE / f"{name}.decisions.bin", decisions)
    count = sum(event_type(d) != "policy_configured" for d in decisions)
    sidecar = {
        "input": f"{input_name}.input.bin",
        "decisions": f"{name}.decisions.bin",
        "decision_count": count,
        "policy": POLICY,
        "policy_version": POLICY_VERSION,
        "divergence": None
        if expect is None
        else {"partition": 0, **expect, "fields": fields or []},
    }
    (HERE / f"{name}.json").write_text(json.dumps(sidecar, indent=2) + "\n")


def main() -> None:
    for name, (seed, jobs, arrival_s, bursts) in [*SCENARIOS.items(), LIVENESS]:
        steps = record(name, seed, jobs, arrival_s, bursts, liveness=name == LIVENESS[0])
        if name == TAMPERED_FROM:
            tamper(name, steps)
        if name == "serving-mixed":
            tamper_plan(name, steps)
        decided = sum(len(step.decisions) for step in steps)
        print(f"{name}: {len(steps)} inputs, {decided} decisions ({POLICY} v{POLICY_VERSION})")


if __name__ == "__main__":
    main()
