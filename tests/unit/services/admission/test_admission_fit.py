"""Admission and placement agree on whether a job fits a node: both judge a node's GPU
memory by ``libs.core.model.node_gpu_memory_gib`` (its smallest GPU's), so a job
admitted is one placement can place, and one placement could never place is refused."""

from __future__ import annotations

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import PolicyConfig, Scheduler, simulated
from libs.events import event_type, new_envelope
from libs.events.log_step import decide
from tests.unit.services.admission.doubles import Projector, submit

GIB = 1 << 30
# One node, two H100s of different memory: 80 GiB and 40 GiB.
MIXED = types_pb2.NodeInventory(
    node_id="mixed",
    cluster="default",
    executor=types_pb2.EXECUTOR_SIMULATED,
    gpus=[
        types_pb2.Gpu(index=0, type="H100", memory_bytes=80 * GIB),
        types_pb2.Gpu(index=1, type="H100", memory_bytes=40 * GIB),
    ],
)


def placed(log: list[events_pb2.Envelope]) -> bool:
    """Whether placement, given the node and admission's log, places the job."""
    scheduler = Scheduler(PolicyConfig())
    registered = new_envelope(
        events_pb2.NodeRegistered(inventory=MIXED), producer="node-agent", cluster="default"
    )
    inputs = [registered, *log]
    decided = [
        event_type(out)
        for offset, env in enumerate(inputs)
        for out in decide(scheduler, env, partition=0, offset=offset)
    ]
    return "task_placed" in decided


@pytest.mark.parametrize("asks_gib", [24, 40, 41, 80])
async def test_admission_admits_what_placement_places_on_gpus_of_different_memory(
    asks_gib: int,
) -> None:
    spec = types_pb2.JobSpec(
        allocation="team-a",
        gpus=1,
        gpu_type="H100",
        min_gpu_memory_gib=asks_gib,
        command=["true"],
        env=simulated.to_env(simulated.SimulatedRun(60)),
    )
    _, log = await submit(spec, Projector([types_pb2.Node(inventory=MIXED)]))
    admitted = "job_admitted" in [event_type(env) for env in log]
    assert admitted == placed(log) == (asks_gib <= 40)
