"""One recorded log, counted by everyone who counts it: the core that decided it (as
placement, the simulator and admission's explainer run it), the projector's metrics and
the console (both from the projector's views, folded from the same log), and admission's
view of the nodes. At every input they agree on the cluster's load
(``libs.core.service_level.Load``: capacity, busy GPUs, and per allocation the jobs
waiting, the charged GPUs held and asked for) and on every node's GPUs.

The projector's metrics and the console count with one function
(``libs.readmodels.occupancy.sample``), the core with its own state
(``Scheduler.occupancy``); all three by ``libs.core.service_level``'s definitions."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import PolicyConfig, Scheduler
from libs.events import event_type
from libs.events.convert import node_from_proto
from libs.events.log_step import decide
from libs.events.logfile import read_log
from libs.readmodels.jobs import JobRecords
from libs.readmodels.nodes import apply_node_event, node_key, without_ended_tasks
from libs.readmodels.occupancy import by_cluster, sample
from tests.golden.record import HERE

# Counted after every input, but every 8th of serving-mixed's 3,816 (its views list
# hundreds of workflows, each put together from its tasks: every input would take 80 s).
STRIDE = {"serving-mixed": 8}
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


def _counted(name: str) -> Iterator[tuple[int, Scheduler, list[types_pb2.Node], JobRecords]]:
    """After each input and the decisions it caused: the core that decided, and the
    projector's views folded from the log (its node and job tables)."""
    scheduler = Scheduler(PolicyConfig())
    nodes: dict[str, types_pb2.Node] = {}
    jobs = JobRecords({}, {}, {})
    recorded = _decisions_by_input(name)
    golden = json.loads((HERE / f"{name}.json").read_text())
    for offset, env in enumerate(read_log(HERE / golden["input"])):
        decide(scheduler, env, partition=0, offset=offset)
        for folded in (env, *recorded.get(offset, ())):
            jobs.apply(folded)
            key = node_key(folded)
            if key is not None:
                nodes[key] = apply_node_event(nodes.get(key), folded)
        yield offset, scheduler, list(nodes.values()), jobs


@pytest.mark.parametrize("name", LOGS)
def test_the_core_the_metrics_the_console_and_admission_count_one_log_alike(name: str) -> None:
    checked = 0
    for offset, scheduler, nodes, jobs in _counted(name):
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
        # Admission judges a job against the nodes as the projector lists them; one
        # that offers no GPU (placement refuses its registration) can hold no job.
        live = [node for node in listed if not node.lost and node.inventory.gpus]
        assert {n.inventory.node_id: node_from_proto(n.inventory) for n in live} == {
            str(node_id): spec for node_id, spec in scheduler.nodes().items()
        }, where
        checked += 1
    assert checked > 200
