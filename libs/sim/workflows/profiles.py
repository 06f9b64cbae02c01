"""The Compass workflow profiles: the four workflows, their models and the cluster's
costs, loaded from the published file (``../shared/data/compass/workflows.json``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from libs.config.document import ConfigError, load
from libs.config.workflow import ProfilesFile
from libs.core.compass import (
    Costs,
    Task,
    Workflow,
    WorkflowError,
    build_workflow,
)

# The published profiles, where a checkout keeps them (../shared, next to the repo).
PROFILES = Path(__file__).resolve().parents[4] / "shared" / "data" / "compass" / "workflows.json"


@dataclass(frozen=True)
class Profiles:
    """The published workflow profiles: DAGs, their best cases and the cluster's costs."""

    workflows: tuple[Workflow, ...]
    best_case_ms: dict[str, float]
    costs: Costs


def load_profiles(path: Path) -> Profiles:
    """Read ``workflows.json`` (``libs.config.workflow``); a ``ConfigError`` names the file
    and key when it cannot be read or breaks a rule."""
    file = load(ProfilesFile, path)
    costs = file.cluster.costs()
    flows = []
    for name, flow in file.workflows.items():
        tasks = [
            Task(
                t.id, t.model or "", file.model_mb(t), t.run_ms, t.in_kb, t.out_kb, tuple(t.parents)
            )
            for t in flow.tasks
        ]
        try:
            flows.append(build_workflow(name, tasks, costs.gpu_memory_mb))
        except WorkflowError as exc:
            raise ConfigError(f"{path}: workflows.{name}: {exc}") from None
    best = {name: flow.best_case_ms for name, flow in file.workflows.items()}
    return Profiles(tuple(flows), best, costs)


def keyed(workflow: Workflow) -> Workflow:
    """The workflow with each model named per workflow, as the source caches them."""
    return dataclasses.replace(
        workflow,
        tasks=tuple(
            dataclasses.replace(t, model=f"{workflow.name}/{t.model}") if t.model else t
            for t in workflow.tasks
        ),
    )
