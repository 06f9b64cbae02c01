"""What the simulator replays: jobs with their true runtimes, the cluster and the budget."""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.budget_tree import BudgetTree
from libs.core.model import JobSpec, NodeSpec


@dataclass(frozen=True)
class SimJob:
    at: float  # submission time
    job_id: str
    spec: JobSpec
    runtime_s: float  # GPU time the job needs to finish; the policy never sees it


@dataclass(frozen=True)
class Workload:
    jobs: tuple[SimJob, ...]  # in submission order
    nodes: tuple[NodeSpec, ...]  # all join when the simulation starts
    tree: BudgetTree
    cancels: tuple[tuple[float, str], ...] = ()  # (time, job id) from a recorded log

    @property
    def capacity(self) -> int:
        return sum(node.gpu_count for node in self.nodes)
