"""Workflow files: one workflow (``qm submit --workflow``), or the Compass profile shape.

One workflow: ``{name, models, tasks: [{id, model, model_mb, run_ms, in_kb, out_kb,
parents}]}``. Several: ``{models: {MODEL: MB}, workflows: {NAME: {tasks: [...]}}}``, which
is also the shape of the published Compass profiles (``workflows.json``: with the
cluster's costs, each workflow's ``best_case_ms`` and notes). A task without ``model_mb``
takes its model's size from ``models``; a null or empty model is glue code with no model.
Sizes in MB, times in ms, transfers in KB. The rules of a DAG (no cycle, known parents,
sizes > 0) are the core's and admission's to check; a file is checked for its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, StringConstraints, model_validator

from libs.config.document import ConfigError, FileModel
from libs.core.compass import Costs

Text = Annotated[str, StringConstraints(min_length=1)]
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Rate = Annotated[float, Field(gt=0)]


class TaskEntry(FileModel):
    id: Text = Field(validation_alias=AliasChoices("id", "task_id"))
    model: str | None = None
    model_mb: Amount | None = None
    run_ms: Amount = 0.0
    in_kb: Amount = 0.0
    out_kb: Amount = 0.0
    parents: list[Text] = Field(default_factory=list)


class WorkflowEntry(FileModel):
    name: Text | None = None
    tasks: Annotated[list[TaskEntry], Field(min_length=1)]
    best_case_ms: Rate | None = None  # the profiles': latency with no queueing


class ClusterCosts(FileModel):
    """The profiles' cluster: one GPU's model memory and the transfer rates."""

    gpu_memory_mb: Rate
    host_to_gpu_mb_per_ms: Rate
    node_to_node_mb_per_ms: Rate
    gpu_memory_note: str | None = None
    host_to_gpu_note: str | None = None
    node_to_node_note: str | None = None

    def costs(self) -> Costs:
        return Costs(self.host_to_gpu_mb_per_ms, self.node_to_node_mb_per_ms, self.gpu_memory_mb)


class WorkflowFile(FileModel):
    name: Text | None = None
    tasks: Annotated[list[TaskEntry], Field(min_length=1)] | None = None
    models: dict[Text, Amount] = Field(default_factory=dict)
    workflows: Annotated[Mapping[Text, WorkflowEntry], Field(min_length=1)] | None = None
    cluster: ClusterCosts | None = None
    # Documentation the published profiles carry along.
    about: str | None = None
    models_note: str | None = None
    workload: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _shape(self) -> WorkflowFile:
        if (self.tasks is None) == (self.workflows is None):
            raise ValueError("expected either tasks (one workflow) or workflows (several)")
        flows = {"": self.tasks or []} if self.workflows is None else self.entries()
        for flow, tasks in flows.items():
            for position, task in enumerate(tasks):
                if task.model and task.model_mb is None and task.model not in self.models:
                    where = f"workflows.{flow}.tasks" if flow else "tasks"
                    raise ValueError(
                        f"{where}[{position}].model: {task.model!r} has no model_mb and is "
                        f"not in models ({', '.join(self.models) or 'none'})"
                    )
        return self

    def entries(self) -> dict[str, list[TaskEntry]]:
        return {name: flow.tasks for name, flow in (self.workflows or {}).items()}

    def model_mb(self, task: TaskEntry) -> float:
        """The size of the task's model: its own ``model_mb``, else the models table's."""
        if task.model_mb is not None:
            return task.model_mb
        return self.models[task.model] if task.model else 0.0

    def chosen(self, path: Path, name: str) -> tuple[str, list[TaskEntry]]:
        """The workflow called ``name`` (optional when the file holds one) and its tasks."""
        if self.workflows is None:
            own = self.name or path.stem
            if name and name != own:
                raise ConfigError(f"{path} holds one workflow, {own!r}, not {name!r}")
            return own, self.tasks or []
        names = ", ".join(self.workflows)
        if not name and len(self.workflows) > 1:
            raise ConfigError(
                f"{path} holds several workflows ({names}): pick one (--workflow-name)"
            )
        picked = name or next(iter(self.workflows))
        if picked not in self.workflows:
            raise ConfigError(f"{path}: no workflow {picked!r}; it has {names}")
        return self.workflows[picked].name or picked, self.workflows[picked].tasks


class ProfileEntry(WorkflowEntry):
    best_case_ms: Rate


class ProfilesFile(WorkflowFile):
    """The Compass profiles as the simulator needs them: costs and best cases included."""

    workflows: Annotated[Mapping[Text, ProfileEntry], Field(min_length=1)]
    cluster: ClusterCosts
