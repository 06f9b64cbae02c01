from __future__ import annotations

import math
from dataclasses import replace

import pytest

from libs.core import JobSpec, Limits, NodeId, NodeKind, NodeSpec, validate_job
from libs.core.compass.workflow import Task, Workflow
from tests.builders import job

LEAVES = ["team-a", "team-b"]


def test_a_valid_job_has_no_violations() -> None:
    assert validate_job(job(2, min_runtime_s=3600), Limits(), LEAVES) == []
    assert validate_job(job(2, runtime_estimate_s=7200.0), Limits(), LEAVES) == []


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [
        (
            job(0),
            "gpus",
            "must be at least 1, got 0: Quartermaster schedules GPU work; "
            "run CPU-only jobs elsewhere",
        ),
        (job(65), "gpus", "must be between 1 and 64, got 65"),
        (job(1, allocation=""), "allocation", "is required"),
        (
            job(1, allocation="nope"),
            "allocation",
            "unknown allocation 'nope'; known: team-a, team-b",
        ),
        (job(1, user=""), "user", "is required"),
        (
            job(1, min_runtime_s=8 * 3600 + 1),
            "min_runtime",
            "must be between 0 and 28800 s (8 h), got 28801",
        ),
        (job(1, command=()), "command", "is required (the program and its arguments)"),
        (
            job(1, simulated_duration_s=-1.0),
            "env[QM_SIMULATED_SECONDS]",
            "must be between 0 and 31622400 s",
        ),
        *(
            (
                job(1, runtime_estimate_s=bad),
                "runtime_estimate",
                "must be between 0 and 31622400 s",
            )
            for bad in (-1.0, math.nan, math.inf, 31622401.0)
        ),
        (
            job(1, env=(("QM_SIMULATED_EXIT", "zero"),)),
            "env[QM_SIMULATED_EXIT]",
            "must be an integer exit code (32 bits)",
        ),
        (
            job(1, env=(("QM_SIMULATED_COLOUR", "blue"),)),
            "env[QM_SIMULATED_COLOUR]",
            "is not one of QM_SIMULATED_SECONDS, QM_SIMULATED_EXIT, QM_SIMULATED_UTILIZATION",
        ),
    ],
)
def test_each_rule_names_its_field(spec: object, field: str, rule: str) -> None:
    [violation] = validate_job(spec, Limits(), LEAVES)  # type: ignore[arg-type]
    assert (violation.field, violation.rule) == (field, rule)


LOCAL = (  # the local stack's nodes: processes on H100s, simulated serving T4s
    NodeSpec(NodeId("gpu-0"), "H100", tuple(range(8)), 80.0),
    NodeSpec(NodeId("gpu-1"), "H100", tuple(range(8)), 80.0),
    NodeSpec(NodeId("serve-0"), "T4", tuple(range(4)), 15.0, NodeKind.SERVING),
)
HERE = "GPU types here: H100 (80 GiB, 16 GPUs), T4 (15 GiB, 4 GPUs, workflows only)"


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [
        (job(1, gpu_type="NOPE"), "gpu_type", f"no NOPE node here takes a job's command; {HERE}"),
        (job(1, gpu_type="T4"), "gpu_type", f"no T4 node here takes a job's command; {HERE}"),
        (
            job(1, gpu_type="T4", simulated_duration_s=1.0),
            "gpu_type",
            f"no T4 node here takes batch jobs; {HERE}",
        ),
        (
            job(1, min_gpu_memory_gib=141),
            "min_gpu_memory_gib",
            f"no node here has 141 GiB per GPU for a job's command; {HERE}",
        ),
        (
            job(1, gpu_type="H100", min_gpu_memory_gib=81),
            "min_gpu_memory_gib",
            f"no node here has 81 GiB per GPU for a job's command; {HERE}",
        ),
    ],
)
def test_what_no_registered_node_offers_is_refused_naming_what_they_do(
    spec: JobSpec, field: str, rule: str
) -> None:
    [violation] = validate_job(spec, Limits(nodes=LOCAL), LEAVES)
    assert (violation.field, violation.rule) == (field, rule)


def test_what_registered_nodes_offer_is_accepted() -> None:
    for spec in (job(1), job(8, gpu_type="H100", min_gpu_memory_gib=80)):
        assert validate_job(spec, Limits(nodes=LOCAL), LEAVES) == []
    on_t4 = replace(flow(wf_task("a")), gpu_type="T4")
    assert validate_job(on_t4, Limits(nodes=LOCAL), LEAVES) == []  # serving nodes take it


def test_an_operator_may_allow_types_no_node_has_yet() -> None:
    limits = Limits(gpu_types=frozenset({"B200"}), nodes=LOCAL)
    assert validate_job(job(1, gpu_type="B200"), limits, LEAVES) == []
    [violation] = validate_job(job(1, gpu_type="V100"), limits, LEAVES)
    assert violation.rule.endswith(f"{HERE}, B200 (no node yet)")


def test_without_a_view_of_the_nodes_no_type_is_refused() -> None:
    assert validate_job(job(1, gpu_type="V100"), Limits(), LEAVES) == []


# -- workflows ---------------------------------------------------------------


def wf_task(
    task_id: str, *parents: str, model: str = "", model_mb: float = 0.0, run_ms: float = 10.0
) -> Task:
    return Task(task_id, model, model_mb, run_ms, 1.0, 1.0, parents)


def flow(*tasks: Task, name: str = "translation") -> JobSpec:
    """A workflow job as admission sees it: tasks as submitted, unchecked."""
    return job(1, command=(), workflow=Workflow(name, tasks))


VALID = flow(
    wf_task("opt", model="OPT", model_mb=5720),
    wf_task("mt5_a", "opt", model="mt5", model_mb=2000),
    wf_task("aggregate", "mt5_a"),
)


def test_a_valid_workflow_needs_no_command() -> None:
    assert validate_job(VALID, Limits(gpu_memory_mb=14_000), LEAVES) == []


def test_a_workflow_in_any_order_is_valid() -> None:
    backwards = flow(*reversed(VALID.workflow.tasks))  # type: ignore[union-attr]
    assert validate_job(backwards, Limits(), LEAVES) == []


def test_a_workflow_may_still_give_a_command_but_not_an_empty_one() -> None:
    assert validate_job(replace(VALID, command=("serve", "--fast")), Limits(), LEAVES) == []
    [violation] = validate_job(replace(VALID, command=("",)), Limits(), LEAVES)
    assert (violation.field, violation.rule) == ("command", "the program must not be empty")


def test_a_batch_job_still_needs_a_command() -> None:
    [violation] = validate_job(job(1, command=()), Limits(), LEAVES)
    assert violation.field == "command"


def test_a_workflow_runs_each_task_on_one_gpu() -> None:
    [violation] = validate_job(replace(VALID, gpus=2), Limits(), LEAVES)
    assert str(violation) == "gpus: must be 1 for a workflow (each task runs on one GPU), got 2"


@pytest.mark.parametrize(
    ("tasks", "field", "rule"),
    [
        (
            (wf_task("a", "b"), wf_task("b", "a")),
            "workflow.tasks[a]",
            "part of a cycle",
        ),
        (
            (wf_task("a"), wf_task("b", "ghost")),
            "workflow.tasks[b]",
            "unknown parent 'ghost'",
        ),
        (
            (wf_task("a"), wf_task("a")),
            "workflow.tasks[a]",
            "duplicate task id",
        ),
        (
            (wf_task("a", run_ms=0),),
            "workflow.tasks[a]",
            "run_ms must be > 0",
        ),
        (
            (wf_task("a", model="OPT", model_mb=-1),),
            "workflow.tasks[a]",
            "model OPT needs a size > 0 MB",
        ),
        (
            (wf_task("opt", model="OPT", model_mb=20_000),),
            "workflow.tasks[opt]",
            "model OPT (20000 MB) does not fit any GPU (the largest holds 14000 MB)",
        ),
        (
            (wf_task("a", model="mt5", model_mb=2000), wf_task("b", model="mt5", model_mb=2100)),
            "workflow.tasks[b]",
            "model mt5 is 2100 MB here but 2000 MB in task a",
        ),
        (
            (wf_task("a", model="OPT", model_mb=math.inf),),
            "workflow.tasks[a]",
            "model_mb must be a finite number",
        ),
        (
            (wf_task(""),),
            "workflow.tasks",
            "a task has no id",
        ),
        ((), "workflow.tasks", "a workflow needs at least one task"),
        # Ids may hold the separators of the error text: the field still names the task.
        (
            (wf_task("x: y", "a/b: c"), wf_task("a/b: c"), wf_task("a/b", "nope")),
            "workflow.tasks[a/b]",
            "unknown parent 'nope'",
        ),
    ],
)
def test_a_broken_workflow_names_its_task(tasks: tuple[Task, ...], field: str, rule: str) -> None:
    [violation] = validate_job(flow(*tasks), Limits(gpu_memory_mb=14_000), LEAVES)
    assert (violation.field, violation.rule) == (field, rule)


def test_a_workflow_needs_a_name() -> None:
    [violation] = validate_job(flow(wf_task("a"), name=""), Limits(), LEAVES)
    assert str(violation) == "workflow.name: is required"


def test_with_gpu_memory_unknown_any_model_size_fits() -> None:
    huge = flow(wf_task("opt", model="OPT", model_mb=1e6))
    assert validate_job(huge, Limits(), LEAVES) == []
    [violation] = validate_job(huge, Limits(gpu_memory_mb=80_000), LEAVES)
    assert violation.field == "workflow.tasks[opt]"
