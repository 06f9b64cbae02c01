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
class LeftOut:
    """A job of a recorded log that the replay leaves out: it has no run to replay."""

    at: float  # submission time
    job_id: str
    why: str


@dataclass(frozen=True)
class Workload:
    jobs: tuple[SimJob, ...]  # in submission order
    nodes: tuple[NodeSpec, ...]  # all join when the simulation starts
    tree: BudgetTree
    cancels: tuple[tuple[float, str], ...] = ()  # (time, job id) from a recorded log
    hashed: frozenset[str] = frozenset()  # jobs whose team only a hash of the user chose
    left_out: tuple[LeftOut, ...] = ()  # a recorded log's jobs in the window, not replayed

    @property
    def capacity(self) -> int:
        return sum(node.gpu_count for node in self.nodes)

    def offered_load(self) -> float:
        """GPU time submitted (cut at the last submission) over capacity × that span:
        1.0 means exactly enough GPUs had every job started on arrival."""
        if not self.jobs or not self.capacity:
            return 0.0
        start, end = self.jobs[0].at, self.jobs[-1].at
        work = sum(j.spec.gpus * min(j.runtime_s, end - j.at) for j in self.jobs)
        return work / (self.capacity * max(end - start, 1e-9))
