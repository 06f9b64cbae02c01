"""Jobs that wait for others (``qm submit --after JOB[:ok|:any]``).

A job with dependencies stays out of the queues until each has ended as asked: with
``:ok`` (the default) it must finish with exit code 0, with ``:any`` it must only end.
A dependency on ``:ok`` that ends otherwise (failed, cancelled, preempted, lost, timed
out, rejected) can never be met: the waiting job is cancelled, naming it, and its own
dependents hear of that in turn. The scheduler remembers how every batch job ended
(``outcomes``), so a dependency that ended before its dependent arrived is judged at
once; a workflow's end is not followed, and admission refuses a dependency on one.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.ids import JobId
from libs.core.model import Dependency
from libs.core.queues import Waiting
from libs.core.state import State, Table
from libs.core.wait_reasons import WaitCode, WaitReason


@dataclass(frozen=True)
class Outcome:
    """How a job ended, as its dependents judge it."""

    ok: bool  # finished with exit code 0
    how: str  # for people: "failed with exit code 3", "was cancelled"

    def fact(self) -> str:
        return f"{self.ok}|{self.how}"


@dataclass(frozen=True)
class Verdict:
    """What a waiting job's dependencies say now: it may start (``ready``), can never
    start (``broken``: why, for people), or waits (``waits_for``: the first pending)."""

    ready: bool = False
    broken: str = ""
    waits_for: Dependency | None = None


def judge(after: tuple[Dependency, ...], outcomes: Table[JobId, Outcome]) -> Verdict:
    """The verdict on ``after`` given the jobs that have ended, by the first
    dependency that is broken, else the first still pending."""
    pending: Dependency | None = None
    for dependency in after:
        outcome = outcomes.get(JobId(dependency.job_id))
        if outcome is None:
            pending = pending or dependency
        elif not (outcome.ok or dependency.any_end):
            return Verdict(
                broken=f"dependency {dependency.job_id} {outcome.how} (after {dependency})"
            )
    return Verdict(waits_for=pending) if pending is not None else Verdict(ready=True)


def waiting_reason(dependency: Dependency) -> WaitReason:
    """Why a job that waits for ``dependency`` waits."""
    how = "to end" if dependency.any_end else "to finish with exit code 0"
    return WaitReason.of(WaitCode.DEPENDENCY, job=dependency.job_id, how=how, after=dependency)


class Dependencies:
    """How each ended job ended, and the jobs that wait for others."""

    DERIVED = ("_dependents",)

    def __init__(self, state: State) -> None:
        self.outcomes: Table[JobId, Outcome] = state.table("dependencies.outcomes", Outcome.fact)
        self.blocked: Table[JobId, Waiting] = state.table("dependencies.blocked", Waiting.fact)
        # An index over ``blocked`` (``derived`` rebuilds it): job -> the jobs waiting for it.
        self._dependents: dict[JobId, dict[JobId, None]] = {}

    def derived(self) -> dict[JobId, dict[JobId, None]]:
        """The index rebuilt from ``blocked`` alone (tests compare it with the one kept)."""
        dependents: dict[JobId, dict[JobId, None]] = {}
        for job in self.blocked.values():
            for dependency in job.spec.after:
                dependents.setdefault(JobId(dependency.job_id), {})[job.job_id] = None
        return dependents

    def judge(self, job: Waiting) -> Verdict:
        return judge(job.spec.after, self.outcomes)

    def block(self, job: Waiting) -> None:
        """Keep ``job`` out of the queues until its dependencies have ended."""
        self.blocked[job.job_id] = job
        for dependency in job.spec.after:
            self._dependents.setdefault(JobId(dependency.job_id), {})[job.job_id] = None

    def unblock(self, job_id: JobId) -> Waiting | None:
        job = self.blocked.pop(job_id, None)
        if job is not None:
            for dependency in job.spec.after:
                waiting = self._dependents.get(JobId(dependency.job_id), {})
                waiting.pop(job_id, None)
                if not waiting:
                    self._dependents.pop(JobId(dependency.job_id), None)
        return job

    def ended(self, job_id: JobId, outcome: Outcome) -> list[Waiting]:
        """Record how ``job_id`` ended; the blocked jobs that may now be judged again,
        in submission order."""
        self.outcomes[job_id] = outcome
        waiting = self._dependents.get(job_id, {})
        return sorted((self.blocked[j] for j in waiting), key=lambda job: job.seq)
