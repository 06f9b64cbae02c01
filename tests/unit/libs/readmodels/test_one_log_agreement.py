"""One recorded log, counted by everyone who counts it: the core that decided it (as
placement, the simulator and admission's explainer run it), the projector's metrics and
the console (both from the projector's views, folded from the same log), the
simulator's batch agents and their recorder (acting on the log's decisions), and
admission's view of the nodes. At every input they agree on the cluster's load
(``libs.core.service_level``: capacity, busy GPUs, and per allocation the jobs waiting,
the charged GPUs held and asked for) and on every node's GPUs.

The projector's metrics and the console count with one function
(``libs.readmodels.occupancy.sample``), the core with its own state
(``Scheduler.occupancy``), the simulator with its recorder (``libs.sim.recorder``); all
by ``libs.core.service_level``'s definitions."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    Decision,
    JobArrived,
    PolicyConfig,
    Scheduler,
    TaskEnded,
)
from libs.core.service_level import Occupancy
from libs.events import event_type
from libs.events.convert import node_from_proto, to_input
from libs.events.log_step import step
from libs.events.logfile import read_log
from libs.readmodels.jobs import JobRecords
from libs.readmodels.nodes import apply_node_event, node_key, without_ended_tasks
from libs.readmodels.occupancy import by_cluster, sample
from libs.sim.batch import BatchAgents, EndTask
from libs.sim.recorder import Recorder
from libs.sim.workload import SimJob
from libs.sim.world import World
from tests.golden.record import HERE

# Counted after every input, but every 8th of serving-mixed's 3,816 (its views list
# hundreds of workflows, each put together from its tasks: every input would take 80 s).
STRIDE = {"serving-mixed": 8}
# The logs of clusters like the simulator's (``_Simulator``): no workflows, no node lost.
SIMULATED = {"scheduler-basic", "scheduler-contended"}
LOGS = sorted(
    p.stem for p in HERE.glob("*.json") if json.loads(p.read_text())["divergence"] is None
)


def _decisions_by_input(name: str) -> dict[int, list[events_pb2.Envelope]]:
    by_input: dict[int, list[events_pb2.Envelope]] = defaultdict(list)
    for env in read_log(HERE / f"{name}.decisions.bin"):
        payload = getattr(env, event_type(env))
        if "provenance" in payload.DESCRIPTOR.fields_by_name:
            by_input[payload.provenance.input_offset].append(env)
    return by_input


class _Simulator:
    """The simulator's batch agents and their recorder (``libs.sim.batch``,
    ``libs.sim.recorder``), in a simulated world whose nodes are the log's, acting on
    its inputs and on the core's decisions for them (the recorded decisions, byte for
    byte: tests/golden). It counts the logs of clusters like its own: batch work only
    (serving's GPUs are the mixed simulator's), on nodes that are never lost (its agents
    stop a task only when placement asks: a lost node's tasks are the world's, which the
    golden recorder drives itself)."""

    def __init__(self) -> None:
        self.world = World(deliver=lambda _: None)  # the log says how tasks end
        self.room: dict[str, int] = {}  # GPUs by type: the recorder's view of the cluster
        # Never advanced: its counts are read as they stand, not integrated.
        self.recorder = Recorder(0, {}, 0.0, 1.0, gpus_of_type=self.room)
        self.agents = BatchAgents(self.world, self.recorder)

    def act(self, scheduler: Scheduler, env: events_pb2.Envelope, decided: list[Decision]) -> None:
        event = to_input(env)
        self._join(scheduler)  # the nodes placement took with this input
        match event:
            case JobArrived(spec=spec) if spec.workflow is None:
                runtime_s = spec.simulated_duration_s or 0.0
                self.agents.arrive(SimJob(event.at, event.job_id, spec, runtime_s))
            case TaskEnded() if self._runs(event.task_id, event.node_id):
                self.agents.handle(EndTask(event.task_id))
        for decision in decided:
            self.agents.decide(decision)

    def _runs(self, task_id: str, node_id: str) -> bool:
        """A report of a task's end is believed from the task's own node only."""
        task = self.world.tasks.get(task_id)
        return task is not None and task.node_id == node_id

    def _join(self, scheduler: Scheduler) -> None:
        """The world's nodes are those placement took (a simulated cluster's are given)."""
        nodes = scheduler.nodes()
        for node_id, node in nodes.items():
            if node_id not in self.world.prices:
                self.world.join(node)
        self.room.clear()
        for node in nodes.values():
            self.room[node.gpu_type] = self.room.get(node.gpu_type, 0) + node.gpu_count
        self.recorder.capacity = sum(self.room.values())

    def occupancy(self) -> Occupancy:
        """The recorder's counts (it keeps them to integrate: read as they stand)."""
        accounts = self.recorder._accounts.items()
        return Occupancy(
            self.recorder.capacity,
            sum(self.recorder._busy.values()),
            held={name: a.held for name, a in accounts if a.held},
            asked={name: a.asked for name, a in accounts if a.asked},
        )


def _counted(
    name: str,
) -> Iterator[tuple[int, Scheduler, list[types_pb2.Node], JobRecords, _Simulator | None]]:
    """After each input and the decisions it caused: the core that decided, the
    projector's views folded from the log (its node and job tables), and the simulator."""
    scheduler = Scheduler(PolicyConfig())
    nodes: dict[str, types_pb2.Node] = {}
    jobs = JobRecords({}, {}, {})
    simulator = _Simulator() if name in SIMULATED else None
    recorded = _decisions_by_input(name)
    golden = json.loads((HERE / f"{name}.json").read_text())
    for offset, env in enumerate(read_log(HERE / golden["input"])):
        decided = step(scheduler, env)
        if simulator is not None:
            simulator.act(scheduler, env, decided)
        for folded in (env, *recorded.get(offset, ())):
            jobs.apply(folded)
            key = node_key(folded)
            if key is not None:
                nodes[key] = apply_node_event(nodes.get(key), folded)
        yield offset, scheduler, list(nodes.values()), jobs, simulator


@pytest.mark.parametrize("name", LOGS)
def test_every_counter_counts_one_log_alike(name: str) -> None:
    checked = 0
    for offset, scheduler, nodes, jobs, simulator in _counted(name):
        if offset % STRIDE.get(name, 1):
            continue
        heads = jobs.heads_with_specs()  # what the metrics count
        listed = [without_ended_tasks(node, jobs.job) for node in nodes]  # as ListNodes does
        console = sample(0.0, listed, heads).occupancy()
        [metrics] = by_cluster(0.0, listed, heads).values() or [sample(0.0, [], [])]
        core = scheduler.occupancy()
        where = f"{name}, after input {offset}"
        assert metrics.occupancy() == console, where
        # Admission records a submission, then its verdict: the views count the job as
        # waiting from the first, the core from the second (the next input).
        admitted = [job for job in heads if job.state != types_pb2.JOB_STATE_SUBMITTED]
        assert sample(0.0, listed, admitted).occupancy() == core, where
        if simulator is not None:  # it counts no jobs, only their GPUs
            assert simulator.occupancy() == Occupancy(
                core.capacity, core.busy, held=core.held, asked=core.asked
            ), where
        # Admission judges a job against the nodes as the projector lists them; one
        # that offers no GPU (placement refuses its registration) can hold no job.
        live = [node for node in listed if not node.lost and node.inventory.gpus]
        assert {n.inventory.node_id: node_from_proto(n.inventory) for n in live} == {
            str(node_id): spec for node_id, spec in scheduler.nodes().items()
        }, where
        checked += 1
    assert checked > 200


def test_the_simulator_counts_logs_that_are_there() -> None:
    assert set(LOGS) >= SIMULATED
