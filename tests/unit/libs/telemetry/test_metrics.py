"""The metric computations: pure functions of what a service already holds."""

from __future__ import annotations

from functools import reduce

from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2, types_pb2

from libs.readmodels.jobs import apply_job_event
from libs.readmodels.nodes import apply_node_event
from libs.telemetry.metrics import (
    GpuCount,
    allocation_loads,
    consumer_lag,
    gpu_states,
    live_gpus,
)
from tests.unit.libs.readmodels.readmodel_builders import (
    admitted,
    env,
    finished,
    idle,
    pending,
    placed,
    registered,
    spec,
)

P0, P1, P2 = (TopicPartition("qm.events", p) for p in range(3))


def fold_job(*envs: events_pb2.Envelope) -> types_pb2.Job:
    job = reduce(apply_job_event, envs, None)
    assert job is not None
    return job


def fold_node(*envs: events_pb2.Envelope) -> types_pb2.Node:
    node = reduce(apply_node_event, envs, None)
    assert node is not None
    return node


def test_lag_is_the_end_offset_less_the_position_never_below_zero() -> None:
    lag = consumer_lag({P0: 10, P1: 4, P2: 7}, {P0: 3, P1: 6})
    # P1's end offset was read before its position moved on; P2 has no position yet.
    assert lag == {P0: 7, P1: 0}


def test_gpus_by_state_across_nodes_and_clusters() -> None:
    jobs = {
        "busy": fold_job(admitted("busy"), placed("busy", "n1", [0, 1])),
        "sleepy": fold_job(admitted("sleepy"), placed("sleepy", "n1", [2]), idle("sleepy")),
        "done": fold_job(admitted("done"), placed("done", "n2", [0]), finished("done")),
        "orphan": fold_job(admitted("orphan"), placed("orphan", "n3", [1, 2])),
    }
    nodes = [
        fold_node(registered("n1"), placed("busy", "n1", [0, 1]), placed("sleepy", "n1", [2])),
        # A task whose job ended holds nothing, even if the node view still lists it.
        fold_node(registered("n2"), placed("done", "n2", [0])),
        fold_node(
            registered("n3"),
            placed("orphan", "n3", [1, 2]),
            env(events_pb2.NodeLost(node_id="n3", reason="no heartbeat")),
        ),
        fold_node(registered("e1", gpus=8, cluster="east")),
    ]
    states = gpu_states(nodes, jobs.get)
    assert states == {
        "default": GpuCount(busy=2, idle=1, free=1 + 4, lost=4, held_on_lost=2),
        "east": GpuCount(free=8),
    }
    assert live_gpus(states) == {"default": 8, "east": 8}


def test_a_task_of_a_job_not_folded_yet_still_holds_its_gpus() -> None:
    node = fold_node(registered("n1"), placed("early", "n1", [0]))
    assert gpu_states([node], lambda _job_id: None) == {"default": GpuCount(busy=1, free=3)}


def test_waiting_jobs_and_demand_per_allocation() -> None:
    jobs = [
        fold_job(admitted("a1", s=spec("team-a", gpus=2)), pending("a1", "no free GPUs")),
        fold_job(admitted("a2", s=spec("team-a", gpus=4)), pending("a2", "no free GPUs")),
        fold_job(admitted("a3", s=spec("team-a", gpus=1)), placed("a3")),
        fold_job(admitted("b1", s=spec("team-b", gpus=8)), placed("b1"), finished("b1")),
    ]
    loads = allocation_loads(jobs)
    assert {key: (load.waiting_jobs, load.demand_gpus) for key, load in loads.items()} == {
        ("default", "team-a"): (2, 2 + 4 + 1)
    }


def test_gpus_serving_holds_with_no_task_running_are_not_free() -> None:
    def held(index: int) -> events_pb2.Envelope:
        return env(events_pb2.ServingHeld(node_id="n1", gpu_index=index, allocation="vision"))

    jobs = {"w": fold_job(admitted("w"), placed("w", "n1", [0]))}
    node = fold_node(registered("n1"), held(0), held(1), placed("w", "n1", [0]))
    states = gpu_states([node], jobs.get)
    assert states == {"default": GpuCount(busy=1, serving=1, free=2)}
    assert live_gpus(states) == {"default": 4}
