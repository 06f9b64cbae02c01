"""Admission rules for a job spec. Each violation names the field and the rule."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from libs.core.compass.workflow import Workflow, WorkflowError, build_workflow
from libs.core.model import JobSpec

HOUR = 3600


@dataclass(frozen=True)
class Limits:
    max_gpus: int = 64
    max_min_runtime_s: int = 8 * HOUR
    gpu_types: frozenset[str] = frozenset()  # empty: any type is accepted
    # The largest GPU a workflow's model may need, in MB (10^6 bytes); inf: unknown,
    # any size is accepted (a model too large for every GPU then waits for one).
    gpu_memory_mb: float = math.inf


@dataclass(frozen=True)
class Violation:
    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


def validate_job(spec: JobSpec, limits: Limits, allocations: Collection[str]) -> list[Violation]:
    """All the ways ``spec`` breaks the rules; empty when it is valid.

    ``allocations`` are the leaves of the budget tree; membership is a
    permission question, checked by the caller. A workflow is judged as
    submitted (``spec_from_proto(..., workflow_as_given=True)``): its tasks in
    any order, checked here as a DAG, each model against ``limits.gpu_memory_mb``;
    the first broken rule is reported, its field naming the task.
    """
    found: list[Violation] = []
    if not spec.allocation:
        found.append(Violation("allocation", "is required"))
    elif spec.allocation not in allocations:
        known = ", ".join(sorted(allocations)) or "none"
        found.append(
            Violation("allocation", f"unknown allocation {spec.allocation!r}; known: {known}")
        )
    if not spec.user:
        found.append(Violation("user", "is required"))
    if spec.workflow is not None:
        if spec.gpus != 1:
            found.append(
                Violation(
                    "gpus", f"must be 1 for a workflow (each task runs on one GPU), got {spec.gpus}"
                )
            )
    elif not 1 <= spec.gpus <= limits.max_gpus:
        found.append(Violation("gpus", f"must be between 1 and {limits.max_gpus}, got {spec.gpus}"))
    if spec.gpu_type and limits.gpu_types and spec.gpu_type not in limits.gpu_types:
        types = ", ".join(sorted(limits.gpu_types))
        found.append(Violation("gpu_type", f"unknown type {spec.gpu_type!r}; known: {types}"))
    if not 0 <= spec.min_runtime_s <= limits.max_min_runtime_s:
        found.append(
            Violation(
                "min_runtime_s",
                f"must be between 0 and {limits.max_min_runtime_s} s "
                f"({limits.max_min_runtime_s / HOUR:g} h), got {spec.min_runtime_s}",
            )
        )
    if spec.workflow is not None:
        # Optional: a simulated node runs a workflow's tasks without one; on a
        # process node every task runs it (and fails at once without one).
        if spec.command and not spec.command[0]:
            found.append(Violation("command", "the program must not be empty"))
        found += _workflow_violations(spec.workflow, limits)
    elif not spec.command or not spec.command[0]:
        found.append(Violation("command", "is required (the program and its arguments)"))
    if spec.simulated_duration_s < 0:
        found.append(Violation("simulated_duration_s", "must be >= 0"))
    if not 0.0 <= spec.simulated_utilization <= 1.0:
        found.append(Violation("simulated_utilization", "must be between 0 and 1"))
    if spec.min_gpu_memory_gib < 0:
        found.append(Violation("min_gpu_memory_gib", "must be >= 0"))
    return found


def _workflow_violations(workflow: Workflow, limits: Limits) -> list[Violation]:
    """The first broken rule of a workflow, its field naming the task.

    ``workflow`` is taken as submitted: its tasks in any order, nothing checked yet.
    """
    if not workflow.name:
        return [Violation("workflow.name", "is required")]
    for task in workflow.tasks:
        for name in ("model_mb", "run_ms", "in_kb", "out_kb"):
            if not math.isfinite(getattr(task, name)):
                return [Violation(_task_field(task.task_id), f"{name} must be a finite number")]
    try:
        build_workflow(workflow.name, workflow.tasks, limits.gpu_memory_mb)
    except WorkflowError as exc:
        return [_violation(workflow, str(exc))]
    return []


def _violation(workflow: Workflow, message: str) -> Violation:
    """``WorkflowError`` text is "<workflow>/<task>: <rule>" or "<workflow>: <rule>"."""
    located = message.removeprefix(f"{workflow.name}/")
    if located != message:
        # The longest task id that fits: ids may themselves hold "/" or ": ".
        ids = sorted({t.task_id for t in workflow.tasks if t.task_id}, key=len, reverse=True)
        for task_id in ids:
            if located.startswith(f"{task_id}: "):
                return Violation(_task_field(task_id), located.removeprefix(f"{task_id}: "))
    return Violation("workflow.tasks", message.removeprefix(f"{workflow.name}: "))


def _task_field(task_id: str) -> str:
    return f"workflow.tasks[{task_id}]"
