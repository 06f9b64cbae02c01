"""Teams and contracts for trace jobs, chosen reproducibly.

A job's team is the one its trace names (a CSV row's ``team``), else the budget-tree leaf
whose ``members`` list its user, else a hash of the user onto the leaves: the fallback,
which the report counts. Every hash is a stable one (SHA-256 of a seed and an id, never
Python's salted ``hash``), so a job keeps its team and contract across runs, machines
and Python versions, and each rule draws its own hash: changing the share of
one rule does not reshuffle the others.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from libs.core.budget_tree import BudgetTree
from libs.core.limits import MAX_RUNTIME_ESTIMATE_S
from libs.core.model import DEBUG_MAX_GPUS, DEBUG_MAX_MIN_RUNTIME_S, JobSpec
from libs.sim.traces.raw import RawJob, TraceError
from libs.sim.workload import SimJob


@dataclass(frozen=True)
class ContractRules:
    seed: str = "qm-sim"
    # A job this small and this short is someone debugging.
    debug_max_runtime_s: float = 1800.0
    # Share of the remaining work (when the trace does not say) run free and preemptible.
    unallocated_share: float = 0.2
    resumable_share: float = 0.7
    # Old-style priorities where the trace has none, inflated as users inflate them:
    # (priority, share); LOW = -1, NORMAL = 0, HIGH = 1, URGENT = 2.
    priority_shares: tuple[tuple[int, float], ...] = ((-1, 0.1), (0, 0.25), (1, 0.5), (2, 0.15))


@dataclass(frozen=True)
class Contract:
    min_runtime_s: int
    resumable: bool
    priority: int


def stable_fraction(*parts: str) -> float:
    """A number in [0, 1) that depends on nothing but ``parts``."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def team_of(user: str, teams: Sequence[str], seed: str) -> str:
    """One of ``teams`` (the budget tree's leaves, sorted) for every job of ``user``."""
    return teams[int(stable_fraction(seed, "team", user) * len(teams))]


@dataclass(frozen=True)
class Teams:
    leaves: tuple[str, ...]  # the budget tree's, sorted
    members: Mapping[str, str] = field(default_factory=dict)  # user -> the first leaf listing them

    @classmethod
    def of(cls, tree: BudgetTree) -> Teams:
        members: dict[str, str] = {}
        for leaf in tree.leaves():
            node = tree.node(leaf)
            for user in node.members if node else ():
                members.setdefault(user, leaf)
        return cls(tuple(tree.leaves()), members)

    def named(self, job: RawJob) -> str | None:
        """The team the trace or the tree names; None where only the hash can place the job."""
        if job.team is None:
            return self.members.get(job.user)
        if job.team not in self.leaves:
            raise TraceError(f"job {job.job_id}: team {job.team!r} is not a budget-tree leaf")
        return job.team

    def of_job(self, job: RawJob, seed: str) -> str:
        return self.named(job) or team_of(job.user, self.leaves, seed)


def contract_of(job: RawJob, rules: ContractRules, max_min_runtime_s: float) -> Contract:
    runtime = max(1, math.ceil(job.runtime_s))
    draw = stable_fraction(rules.seed, "unallocated", job.job_id)
    if job.best_effort:
        min_runtime = 0
    elif job.gpus <= DEBUG_MAX_GPUS and job.runtime_s <= rules.debug_max_runtime_s:
        min_runtime = min(runtime, DEBUG_MAX_MIN_RUNTIME_S)
    elif job.best_effort is None and draw < rules.unallocated_share:
        min_runtime = 0
    else:
        min_runtime = min(runtime, max(1, int(max_min_runtime_s)))
    return Contract(
        min_runtime_s=min_runtime,
        resumable=stable_fraction(rules.seed, "resumable", job.job_id) < rules.resumable_share,
        priority=job.priority if job.priority is not None else _priority(job, rules),
    )


def to_sim_jobs(
    jobs: Iterable[RawJob],
    teams: Teams,
    rules: ContractRules,
    max_min_runtime_s: float,
) -> list[SimJob]:
    out = []
    for job in jobs:
        terms = contract_of(job, rules, max_min_runtime_s)
        spec = JobSpec(
            allocation=teams.of_job(job, rules.seed),
            user=job.user,
            gpus=job.gpus,
            command=("trace-job", job.job_id),
            gpu_type=job.gpu_type or "",  # "": any
            min_runtime_s=terms.min_runtime_s,
            resumable=terms.resumable,
            priority=terms.priority,
            simulated_duration_s=job.runtime_s,
            # Capped so that an absurd limit in a trace cannot get the job rejected.
            runtime_estimate_s=min(job.requested_s or 0.0, MAX_RUNTIME_ESTIMATE_S),
        )
        out.append(SimJob(job.at, job.job_id, spec, job.runtime_s))
    return out


def _priority(job: RawJob, rules: ContractRules) -> int:
    draw = stable_fraction(rules.seed, "priority", job.job_id)
    total = sum(share for _, share in rules.priority_shares)
    for priority, share in rules.priority_shares:
        draw -= share / total
        if draw < 0:
            return priority
    return rules.priority_shares[-1][0]
