"""Workflows at the service edge: specs both ways, model cache inputs, plans and serving."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    ModelEvicted,
    ModelLoaded,
    NodeKind,
    Place,
    Planned,
    PlannedTask,
    Reject,
    ServingTask,
    TaskRefused,
)
from libs.core.compass.workflow import Task, Workflow, build_workflow
from libs.events import decode, encode, new_envelope
from libs.events.convert import (
    decision_payload,
    node_from_proto,
    serving_from_proto,
    spec_from_proto,
    spec_to_proto,
    to_input,
    workflow_from_proto,
)
from libs.events.wire_time import duration_ms, milliseconds, timestamp_ms
from tests.builders import job, proto_workflow

T0 = 1_760_000_000.0
PROVENANCE = types_pb2.Provenance(input_offset=7, policy="budget", policy_version=6)

TRANSLATION = build_workflow(
    "translation",
    [
        Task("opt", "OPT", 5720, 561, 1, 2),
        Task("marian", "marian", 800, 441, 2, 2, ("opt",)),
        Task("mt5_a", "mt5", 2000, 778, 2, 2, ("opt",)),
        Task("mt5_b", "mt5", 2000, 803, 2, 2, ("opt",)),
        Task("aggregate", "", 0, 1, 2, 2, ("marian", "mt5_a", "mt5_b")),
    ],
    14_000,
)


def admitted(spec: types_pb2.JobSpec) -> events_pb2.Envelope:
    return new_envelope(
        events_pb2.JobAdmitted(job_id="j-1", spec=spec),
        producer="test",
        occurred=datetime.fromtimestamp(T0, UTC),
    )


def test_a_workflow_spec_round_trips() -> None:
    spec = job(1, command=(), workflow=TRANSLATION, min_runtime_s=0)
    proto = spec_to_proto(spec)
    assert [t.task_id for t in proto.workflow.tasks] == [t.task_id for t in TRANSLATION.tasks]
    assert list(proto.workflow.tasks[-1].parents) == ["marian", "mt5_a", "mt5_b"]
    assert spec_from_proto(proto) == spec
    assert spec_to_proto(spec_from_proto(proto)) == proto


def test_a_spec_without_workflow_has_none_either_way() -> None:
    proto = spec_to_proto(job(2))
    assert not proto.HasField("workflow")
    assert spec_from_proto(proto).workflow is None


def test_tasks_from_the_log_come_out_in_the_cores_topological_order() -> None:
    shuffled = proto_workflow(("c", ["a", "b"]), ("b", ["a"]), ("a", []))
    spec = spec_from_proto(types_pb2.JobSpec(gpus=1, workflow=shuffled))
    assert spec.workflow is not None
    assert [t.task_id for t in spec.workflow.tasks] == ["a", "b", "c"]
    assert spec.workflow.task("c").parents == ("a", "b")


@pytest.mark.parametrize(
    "broken",
    [
        proto_workflow(("a", ["b"]), ("b", ["a"])),  # a cycle
        proto_workflow(("a", ["ghost"])),  # an unknown parent
        proto_workflow(("a", []), ("a", [])),  # a duplicate id
        types_pb2.Workflow(name="empty"),
    ],
)
def test_a_broken_workflow_on_the_log_is_rejected_naming_the_rule(
    broken: types_pb2.Workflow,
) -> None:
    spec = types_pb2.JobSpec(allocation="team-a", user="ada", gpus=1, workflow=broken)
    rejected = to_input(admitted(spec))
    assert isinstance(rejected, Reject)
    assert rejected.job_id == "j-1" and rejected.field.startswith("workflow.tasks")
    assert rejected.reason.startswith(rejected.field)
    assert workflow_from_proto(broken) is None
    assert to_input(admitted(spec)) == rejected  # the same bytes, the same answer


def test_memory_is_not_checked_from_the_log() -> None:
    huge = types_pb2.Workflow(
        name="w",
        tasks=[
            types_pb2.WorkflowTask(
                task_id="a", model="m", model_mb=1e9, run_duration=duration_ms(1), in_kb=1, out_kb=1
            )
        ],
    )
    workflow = workflow_from_proto(huge)
    assert workflow is not None and workflow.tasks[0].model_mb == 1e9


def test_as_given_keeps_the_tasks_unchecked_for_validation() -> None:
    cyclic = proto_workflow(("b", ["a"]), ("a", ["b"]))
    spec = spec_from_proto(types_pb2.JobSpec(gpus=1, workflow=cyclic), workflow_as_given=True)
    assert spec.workflow == Workflow(
        "w",
        (Task("b", "m-b", 100, 5, 1, 1, ("a",)), Task("a", "m-a", 100, 5, 1, 1, ("b",))),
    )


def test_model_cache_events_become_core_inputs() -> None:
    at = datetime.fromtimestamp(T0, UTC)
    loaded = new_envelope(
        events_pb2.ModelLoaded(
            node_id="n1", gpu_index=3, model="OPT", size_mb=5720, load_duration=duration_ms(562)
        ),
        producer="node-agent",
        occurred=at,
    )
    evicted = new_envelope(
        events_pb2.ModelEvicted(node_id="n1", gpu_index=3, model="OPT", reason="room for mt5"),
        producer="node-agent",
        occurred=at,
    )
    assert to_input(loaded) == ModelLoaded(T0, "n1", 3, "OPT", 5720.0)
    assert to_input(evicted) == ModelEvicted(T0, "n1", 3, "OPT")


def test_a_plan_becomes_workflow_planned() -> None:
    plan = Planned(
        "j-1",
        "compass",
        (
            PlannedTask("opt", "n1", 0, T0 * 1000 + 562, T0 * 1000 + 1123, 562.4),
            PlannedTask("nli", "n2", 5, T0 * 1000 + 1123, T0 * 1000 + 1150, 0.0),
        ),
    )
    payload = decision_payload(plan, PROVENANCE)
    assert isinstance(payload, events_pb2.WorkflowPlanned)
    assert (payload.job_id, payload.mode, payload.provenance) == ("j-1", "compass", PROVENANCE)
    assert [
        (t.name, t.node_id, t.gpu_index, t.start_time, t.finish_time, t.load_duration)
        for t in payload.tasks
    ] == [
        (t.name, t.node_id, t.gpu_index, timestamp_ms(t.start_ms), timestamp_ms(t.finish_ms), d)
        for t, d in zip(plan.tasks, (duration_ms(562.4), Duration()), strict=True)
    ]
    assert payload.tasks[0].load_duration == Duration(nanos=562_400_000)
    env = new_envelope(payload, producer="placement")
    assert decode(encode(env)).workflow_planned == payload


def test_a_refusal_becomes_a_core_input() -> None:
    refused = events_pb2.TaskRefused(
        job_id="j", task_id="j/a", node_id="n1", gpu_index=2, wait=duration_ms(1234.5)
    )
    env = new_envelope(refused, producer="node-agent", occurred=datetime.fromtimestamp(T0, UTC))
    assert to_input(env) == TaskRefused(T0, "j", "j/a", "n1", 2, 1234.5)


@pytest.mark.parametrize(
    ("planned", "reason", "limit"),
    [
        (None, "", None),
        (("n2", 4), "wait on n2 GPU 4 exceeds 1.5 × run time", 0.0),  # 0 is a limit too
        (None, "", 233.4),
    ],
)
def test_a_serving_place_carries_its_task(
    planned: tuple[str, int] | None, reason: str, limit: float | None
) -> None:
    serving = ServingTask(
        "mt5_a", "mt5", 2000.0, 778.0, 0.5, ("OPT", "mt5"), planned, reason, limit
    )
    spec = job(1, command=(), workflow=TRANSLATION)
    place = Place("j-1", "j-1/mt5_a", "n1", (2,), spec, serving)
    payload = decision_payload(place, PROVENANCE)
    assert isinstance(payload, events_pb2.TaskPlaced)
    assert payload.task_id == "j-1/mt5_a" and list(payload.gpu_indices) == [2]
    # The task's part of the workflow is its ServingTask; the whole stays in the job's
    # submission rather than going out with every task.
    assert not payload.spec.HasField("workflow")
    got = payload.serving
    assert (
        got.name,
        got.model,
        got.model_mb,
        milliseconds(got.run_duration),
        milliseconds(got.input_delay),
    ) == (
        "mt5_a",
        "mt5",
        2000.0,
        778.0,
        0.5,
    )
    assert list(got.upcoming) == ["OPT", "mt5"]
    assert got.planned_node_id == (planned[0] if planned else "")
    assert got.planned_gpu_index == (planned[1] if planned else 0)
    assert got.reason == reason
    assert got.HasField("wait_limit") == (limit is not None)
    assert serving_from_proto(got) == serving


def test_a_batch_place_has_no_serving() -> None:
    payload = decision_payload(Place("j", "j/0", "n1", (0, 1), job(2)), PROVENANCE)
    assert isinstance(payload, events_pb2.TaskPlaced) and not payload.HasField("serving")


@pytest.mark.parametrize(
    ("executor", "workflows_only", "kind"),
    [
        (types_pb2.EXECUTOR_UNSPECIFIED, False, NodeKind.PROCESS),
        (types_pb2.EXECUTOR_PROCESS, False, NodeKind.PROCESS),
        (types_pb2.EXECUTOR_SIMULATED, False, NodeKind.SIMULATED),
        (types_pb2.EXECUTOR_SIMULATED, True, NodeKind.SERVING),
        (types_pb2.EXECUTOR_PROCESS, True, NodeKind.SERVING),
    ],
)
def test_a_node_is_what_it_runs_and_its_smallest_gpu(
    executor: types_pb2.Executor.ValueType, workflows_only: bool, kind: NodeKind
) -> None:
    inventory = types_pb2.NodeInventory(
        node_id="n1",
        executor=executor,
        workflows_only=workflows_only,
        gpus=[
            types_pb2.Gpu(index=0, type="T4", memory_bytes=16 << 30),
            types_pb2.Gpu(index=1, type="H100", memory_bytes=80 << 30),
        ],
    )
    node = node_from_proto(inventory)
    assert (node.kind, node.gpu_type, node.gpu_memory_gib) == (kind, "H100/T4", 16.0)


def test_every_task_placed_carries_its_spec_whole_and_apart() -> None:
    # Placement converts a workflow's spec once for all its tasks; each placement still
    # carries the spec as spec_to_proto writes it, and changing one changes no other.
    spec = job(1, command=(), workflow=TRANSLATION, min_runtime_s=0)
    places = [Place("j-1", f"j-1/{t.task_id}", "n1", (0,), spec) for t in TRANSLATION.tasks]
    first, second = (decision_payload(p, PROVENANCE) for p in places[:2])
    assert isinstance(first, events_pb2.TaskPlaced) and isinstance(second, events_pb2.TaskPlaced)
    assert first.spec == second.spec == spec_to_proto(spec)
    first.spec.workflow.tasks[0].task_id = "changed"
    third = decision_payload(places[2], PROVENANCE)
    assert isinstance(third, events_pb2.TaskPlaced)
    assert third.spec == second.spec == spec_to_proto(spec)
