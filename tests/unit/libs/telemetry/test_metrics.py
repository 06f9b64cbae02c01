"""The metrics' figures from the projector's views: the consumer lag, and the cluster
counted as the console counts it (``libs.readmodels.occupancy.by_cluster``)."""

from __future__ import annotations

from functools import reduce

from aiokafka.structs import TopicPartition
from qm.v1 import events_pb2, types_pb2

from libs.readmodels.jobs import apply_job_event
from libs.readmodels.nodes import apply_node_event, without_ended_tasks
from libs.readmodels.occupancy import Sample, by_cluster
from libs.telemetry.metrics import consumer_lag
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


def figures(nodes: list[types_pb2.Node], jobs: dict[str, types_pb2.Job]) -> dict[str, Sample]:
    """As the projector's ``/metrics`` counts them: tasks their job ended left out."""
    return by_cluster(0.0, [without_ended_tasks(n, jobs.get) for n in nodes], jobs.values())


def states(samples: dict[str, Sample]) -> dict[str, dict[str, int]]:
    return {cluster: s.total.states() for cluster, s in samples.items()}


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
    samples = figures(nodes, jobs)
    assert states(samples) == {
        "default": {"busy": 2, "idle": 1, "serving": 0, "free": 1 + 4, "lost": 4},
        "east": {"busy": 0, "idle": 0, "serving": 0, "free": 8, "lost": 0},
    }
    assert samples["default"].total.lost_held == 2
    assert {cluster: s.capacity for cluster, s in samples.items()} == {"default": 8, "east": 8}


def test_a_task_of_a_job_not_folded_yet_still_holds_its_gpus() -> None:
    node = fold_node(registered("n1"), placed("early", "n1", [0]))
    assert states(figures([node], {})) == {
        "default": {"busy": 1, "idle": 0, "serving": 0, "free": 3, "lost": 0}
    }


def test_waiting_jobs_and_demand_per_allocation() -> None:
    """Demand is what charged work holds plus what its waiting work asks for, as the
    console owes it: a job larger than the cluster is waiting, but no demand."""

    def charged(gpus: int) -> types_pb2.JobSpec:
        return spec("team-a", gpus=gpus, min_runtime_s=600)

    jobs = {
        "a1": fold_job(admitted("a1", s=charged(2)), pending("a1", "no free GPUs")),
        "a2": fold_job(admitted("a2", s=charged(4)), pending("a2", "no free GPUs")),
        "a3": fold_job(admitted("a3", s=charged(1)), placed("a3", spec=charged(1))),
        "a4": fold_job(admitted("a4", s=charged(64)), pending("a4", "too big")),
        "free": fold_job(admitted("free", s=spec("team-a", gpus=2)), pending("free", "later")),
        "b1": fold_job(admitted("b1", s=spec("team-b", gpus=8)), placed("b1"), finished("b1")),
    }
    node = fold_node(registered("n1", gpus=8), placed("a3"), placed("b1"))
    [(cluster, sample)] = figures([node], jobs).items()
    assert cluster == "default"
    assert sample.waiting == {"team-a": 4}
    demand = {a: sample.occupancy().demand(a) for a in ("team-a", "team-b")}
    assert demand == {"team-a": 1 + 2 + 4, "team-b": 0}


def test_gpus_serving_holds_with_no_task_running_are_not_free() -> None:
    def held(index: int) -> events_pb2.Envelope:
        return env(events_pb2.ServingHeld(node_id="n1", gpu_index=index, allocation="vision"))

    jobs = {"w": fold_job(admitted("w"), placed("w", "n1", [0]))}
    node = fold_node(registered("n1"), held(0), held(1), placed("w", "n1", [0]))
    samples = figures([node], jobs)
    assert states(samples) == {
        "default": {"busy": 1, "idle": 0, "serving": 1, "free": 2, "lost": 0}
    }
    assert samples["default"].capacity == 4
