"""Admission of workflow jobs: the DAG checked by task, model sizes against known GPUs."""

from __future__ import annotations

from typing import Any

import grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from libs.core import Limits
from libs.events import event_type
from libs.events.wire_time import duration_ms
from tests.unit.services.admission.doubles import CLUSTER, Projector, rejected, submit


def task(name: str, *parents: str, model: str = "", mb: float = 0) -> types_pb2.WorkflowTask:
    return types_pb2.WorkflowTask(
        task_id=name,
        model=model,
        model_mb=mb,
        run_duration=duration_ms(10),
        in_kb=1,
        out_kb=1,
        parents=parents,
    )


def translation(opt_mb: float = 5720) -> types_pb2.Workflow:
    return types_pb2.Workflow(
        name="translation",
        tasks=[
            task("aggregate", "marian", "mt5"),
            task("marian", "opt", model="marian", mb=800),
            task("mt5", "opt", model="mt5", mb=2000),
            task("opt", model="OPT", mb=opt_mb),
        ],
    )


def wf_spec(workflow: types_pb2.Workflow, **kw: Any) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(**{"allocation": "team-a", "gpus": 1, "workflow": workflow, **kw})


async def test_a_workflow_job_without_a_command_is_admitted() -> None:
    reply, sent = await submit(wf_spec(translation()))
    assert isinstance(reply, js.SubmitJobResponse) and reply.job_id.startswith("j-")
    assert [event_type(e) for e in sent] == ["job_submitted", "job_admitted"]
    # Recorded as submitted; the scheduler orders the DAG when it reads the log.
    assert sent[1].job_admitted.spec.workflow == translation()


async def test_a_cyclic_workflow_is_refused_naming_the_task() -> None:
    cyclic = types_pb2.Workflow(name="w", tasks=[task("a", "b"), task("b", "a")])
    reply, event = await rejected(wf_spec(cyclic))
    assert reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reply.details == "invalid job: workflow.tasks[a]: part of a cycle"
    assert (event.field, event.reason) == (
        "workflow.tasks[a]",
        "workflow.tasks[a]: part of a cycle",
    )


async def test_a_model_larger_than_every_gpu_is_refused() -> None:
    reply, event = await rejected(wf_spec(translation(opt_mb=90_000)))
    assert reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert event.field == "workflow.tasks[opt]"
    assert "the largest holds 80000 MB" in reply.details


async def test_the_gpu_type_limits_which_gpus_count() -> None:
    reply, _ = await rejected(wf_spec(translation(opt_mb=20_000), gpu_type="T4"))
    assert "the largest holds 16000 MB" in reply.details
    admitted, _ = await submit(wf_spec(translation(opt_mb=20_000), gpu_type="H100"))
    assert isinstance(admitted, js.SubmitJobResponse)


async def test_without_a_node_view_any_model_size_is_admitted() -> None:
    for projector in (Projector(down=True), Projector([])):
        reply, _ = await submit(wf_spec(translation(opt_mb=90_000)), projector)
        assert isinstance(reply, js.SubmitJobResponse)
        assert projector.asked == ["default"]


async def test_a_configured_gpu_memory_wins_over_the_node_view() -> None:
    projector = Projector(CLUSTER)
    reply, _ = await rejected(wf_spec(translation()), projector, Limits(gpu_memory_mb=4_000))
    assert "the largest holds 4000 MB" in reply.details


async def test_a_workflow_takes_one_gpu_per_task() -> None:
    reply, event = await rejected(wf_spec(translation(), gpus=4))
    assert event.field == "gpus" and "must be 1 for a workflow" in reply.details


async def test_batch_jobs_still_need_a_command() -> None:
    spec = types_pb2.JobSpec(allocation="team-a", gpus=1)
    reply, event = await rejected(spec)
    assert event.field == "command"
    assert reply.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_gpu_type_no_node_has_is_refused_after_a_fresh_look_naming_the_types() -> None:
    projector = Projector(CLUSTER)
    spec = types_pb2.JobSpec(allocation="team-a", gpus=1, gpu_type="A100", command=["true"])
    reply, event = await rejected(spec, projector)
    assert event.field == "gpu_type" and reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reply.details == (
        "invalid job: gpu_type: no A100 node here takes a job's command; "
        "GPU types here: H100 (74.5058 GiB, 2 GPUs), T4 (14.9012 GiB, 2 GPUs)"
    )
    assert projector.asked == ["default", "default"]  # the kept view, then afresh


async def test_an_operator_may_allow_a_type_before_its_nodes_register() -> None:
    spec = types_pb2.JobSpec(allocation="team-a", gpus=1, gpu_type="A100", command=["true"])
    reply, _ = await submit(spec, limits=Limits(gpu_types=frozenset({"A100"})))
    assert isinstance(reply, js.SubmitJobResponse)
