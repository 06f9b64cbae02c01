"""Simulator scenario files (``deploy/sim/*.yaml``): which trace, which part of it, on which
cluster, under which budget, and how trace jobs get contracts.

Paths in a scenario are relative to its file; ``qm sim run`` flags replace single fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, Strict, StringConstraints, model_validator

from libs.config.document import FileModel, read_document, validate
from libs.sim.cluster import ClusterSpec
from libs.sim.mapping import ContractRules
from libs.sim.scenario import Scenario, Targets, Trace

Text = Annotated[str, StringConstraints(min_length=1)]
Share = Annotated[float, Field(ge=0, le=1)]
_CLUSTER, _RULES = ClusterSpec(), ContractRules()


class ClusterEntry(FileModel):
    nodes: Annotated[int, Field(ge=1)] = _CLUSTER.nodes
    gpus_per_node: Annotated[int, Field(ge=1)] = _CLUSTER.gpus_per_node
    gpu_type: Text = _CLUSTER.gpu_type
    gpu_memory_gib: Annotated[float, Field(gt=0)] = _CLUSTER.gpu_memory_gib


class ContractsEntry(FileModel):
    seed: str = _RULES.seed
    debug_max_runtime_s: Annotated[float, Field(ge=0)] = _RULES.debug_max_runtime_s
    unallocated_share: Share = _RULES.unallocated_share
    resumable_share: Share = _RULES.resumable_share
    # [[priority, share], ...]; shares are relative weights.
    priority_shares: Annotated[
        list[Annotated[tuple[int, Annotated[float, Field(ge=0)]], Strict(False)]],
        Field(min_length=1),
    ] = Field(default_factory=lambda: list(_RULES.priority_shares))


_TARGETS = Targets()
Percent = Annotated[float, Field(ge=0)]


class TargetsEntry(FileModel):
    worst_team_pct: Percent = _TARGETS.worst_team_pct
    weighted_pct: Percent = _TARGETS.weighted_pct
    occupancy_pct: Percent | None = _TARGETS.occupancy_pct  # null: not judged
    debug_p90_s: Annotated[float, Field(ge=0)] = _TARGETS.debug_p90_s
    lost_pct: Percent = _TARGETS.lost_pct
    size_rate: Share = _TARGETS.size_rate
    sim_cpu_s: Annotated[float, Field(gt=0)] = _TARGETS.sim_cpu_s


class ScenarioFile(FileModel):
    trace: Trace
    path: Text
    label: Text | None = None  # what the report calls the trace, with its citation
    tree: Text | None = None
    cluster: ClusterEntry | None = None
    contracts: ContractsEntry = ContractsEntry()
    skip_head: Annotated[int, Field(ge=0)] = 0
    start_s: float | None = None
    end_s: float | None = None
    warmup_s: Annotated[float, Field(ge=0)] = 0.0
    # What its class of workload is judged by (the report's verdicts).
    targets: TargetsEntry = TargetsEntry()

    @model_validator(mode="after")
    def _window(self) -> ScenarioFile:
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s:g}) must be after start_s ({self.start_s:g})")
        return self


def load_scenario(path: Path) -> Scenario:
    """The scenario a file describes, its paths resolved against the file's folder."""
    file = validate(ScenarioFile, read_document(path), str(path))
    base = path.parent
    cluster = file.cluster
    return Scenario(
        trace=file.trace,
        path=(base / file.path).resolve(),
        label=file.label or "",
        tree_path=(base / file.tree).resolve() if file.tree else None,
        cluster=ClusterSpec(**cluster.model_dump()) if cluster else None,
        rules=ContractRules(
            **file.contracts.model_dump(exclude={"priority_shares"}),
            priority_shares=tuple(file.contracts.priority_shares),
        ),
        skip_head=file.skip_head,
        start_s=file.start_s,
        end_s=file.end_s,
        warmup_s=file.warmup_s,
        targets=Targets(**file.targets.model_dump()),
    )
