from __future__ import annotations

import pytest
from google.protobuf.message import Message
from qm.v1 import events_pb2

from libs.core.compass import Eviction, GpuWorker
from libs.core.decisions import ServingTask
from libs.events import new_envelope
from libs.events.wire_time import duration_ms
from services.node_agent.launch import LaunchError
from services.node_agent.lifecycle import (
    decision_for,
    ended,
    exit_reason,
    launch_failed,
    model_evicted,
    model_loaded,
    started,
    stop_reason,
    stopped_before_start,
)

TASK = events_pb2.TaskPlaced(job_id="j", task_id="j/0", node_id="sim-0", gpu_indices=[0])


def envelope(payload: Message) -> events_pb2.Envelope:
    return new_envelope(payload, producer="placement")


def test_only_decisions_for_these_nodes_concern_the_agent() -> None:
    mine = {"sim-0": "inc-a", "sim-1": "inc-b"}
    stop = events_pb2.TaskStopRequested(job_id="j", task_id="j/0", node_id="sim-1")
    assert decision_for(envelope(TASK), mine) == TASK
    assert decision_for(envelope(stop), mine) == stop
    assert decision_for(envelope(TASK), {"sim-2": "inc-c"}) is None
    assert decision_for(envelope(events_pb2.JobPending(job_id="j")), mine) is None


def test_decisions_for_an_earlier_incarnation_of_a_node_are_not_acted_on() -> None:
    mine = {"sim-0": "inc-new"}
    stale = events_pb2.TaskPlaced(job_id="j", task_id="j/0", node_id="sim-0")
    stale.node_incarnation = "inc-old"
    current = events_pb2.TaskPlaced()
    current.CopyFrom(stale)
    current.node_incarnation = "inc-new"
    assert decision_for(envelope(stale), mine) is None
    assert decision_for(envelope(current), mine) == current
    lost_before = events_pb2.NodeLost(node_id="sim-0", incarnation="inc-old")
    lost_now = events_pb2.NodeLost(node_id="sim-0", incarnation="inc-new")
    assert decision_for(envelope(lost_before), mine) is None
    assert decision_for(envelope(lost_now), mine) == lost_now


@pytest.mark.parametrize(
    ("exit_code", "stopped_because", "wanted"),
    [
        (0, "", events_pb2.TaskFinished(job_id="j", task_id="j/0", node_id="sim-0")),
        (
            3,
            "",
            events_pb2.TaskFailed(
                job_id="j", task_id="j/0", node_id="sim-0", exit_code=3, reason="exited with code 3"
            ),
        ),
        (
            -9,
            "",
            events_pb2.TaskFailed(
                job_id="j", task_id="j/0", node_id="sim-0", exit_code=-9, reason="killed by SIGKILL"
            ),
        ),
        (
            0,
            "node agent stopped",
            events_pb2.TaskFailed(
                job_id="j", task_id="j/0", node_id="sim-0", exit_code=0, reason="node agent stopped"
            ),
        ),
    ],
)
def test_how_a_task_ended(
    exit_code: int,
    stopped_because: str,
    wanted: events_pb2.TaskFinished | events_pb2.TaskFailed,
) -> None:
    assert ended(TASK, exit_code, stopped_because) == wanted


def test_other_reports() -> None:
    assert started(TASK, 42) == events_pb2.TaskStarted(
        job_id="j", task_id="j/0", node_id="sim-0", pid=42
    )
    failure = launch_failed(TASK, LaunchError("command not found: foo", 127))
    assert (failure.exit_code, failure.reason) == (127, "command not found: foo")
    assert exit_reason(-200) == "killed by signal 200"
    request = events_pb2.TaskStopRequested(task_id="j/0", reason="preempted by k")
    assert stop_reason(request) == "stop requested: preempted by k"
    assert stop_reason(events_pb2.TaskStopRequested(task_id="j/0")) == "stop requested"


def test_model_reports() -> None:
    assert model_evicted("sim-0", 2, Eviction("OPT", 5720, "why")) == events_pb2.ModelEvicted(
        node_id="sim-0", gpu_index=2, model="OPT", reason="why"
    )
    worker = GpuWorker(10_000, 10)
    worker.enqueue("j/0", ServingTask("t", "OPT", 5720, 561, 0, ()), 0)
    begun = worker.start(0)
    assert begun is not None
    assert model_loaded(TASK, 0, begun) == events_pb2.ModelLoaded(
        node_id="sim-0",
        gpu_index=0,
        model="OPT",
        size_mb=5720,
        load_duration=duration_ms(572),
        job_id="j",
        task_id="j/0",
    )
    failed = stopped_before_start(TASK, "stop requested")
    assert (failed.exit_code, failed.reason) == (-15, "stop requested")
