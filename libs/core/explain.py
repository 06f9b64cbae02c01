"""Explanations a person can act on: why a job waits, or what it is doing."""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.decisions import StopCause
from libs.core.fairshare import Standing
from libs.core.ids import JobId, NodeId
from libs.core.queues import Waiting


@dataclass(frozen=True)
class Explanation:
    job_id: JobId
    waiting: bool
    allocation: str
    standing: Standing | None
    jobs_ahead: int
    text: str
    # When it will likely start (seconds since the epoch), where the core knows: a job
    # with the nodes that free soonest earmarked for it; None otherwise.
    starts_at: float | None = None


def explain_waiting(
    job: Waiting,
    standing: Standing | None,
    *,
    reason: str,
    ahead: int,
    reserved: tuple[NodeId, ...] | None,
    starts_at: float | None = None,
    now: float = 0.0,
) -> Explanation:
    """``starts_at`` is set while ``reserved`` nodes are earmarked for the job (not yet
    being freed): when they will likely have room for it."""
    spec = job.spec
    parts = [reason]
    if reserved:
        verb = "is" if len(reserved) == 1 else "are"
        if starts_at is None:
            parts.append(f"{', '.join(reserved)} {verb} reserved for it while preempted work stops")
        else:
            parts.append(
                f"{', '.join(reserved)} {verb} earmarked for it: only work that cannot delay it "
                f"runs there meanwhile; estimated start in {max(starts_at - now, 0):.0f} s"
            )
    parts.append(_standing_text(spec.allocation, standing))
    parts.append(f"{ahead} job{'s' if ahead != 1 else ''} ahead of it")
    if not spec.allocated:
        parts.append("free work runs only on otherwise idle GPUs")
    text = "; ".join(parts)
    return Explanation(job.job_id, True, spec.allocation, standing, ahead, text, starts_at)


def explain_serving(
    job_id: JobId, allocation: str, standing: Standing | None, what: str, waiting: bool
) -> Explanation:
    """A workflow: its plan and progress, or why no GPU has taken it yet."""
    text = f"{what}; {_standing_text(allocation, standing)}"
    return Explanation(job_id, waiting, allocation, standing, 0, text)


def explain_running(
    job_id: JobId,
    allocation: str,
    standing: Standing | None,
    *,
    nodes: list[NodeId],
    protected_until: float | None,
    now: float,
    stopping: StopCause | None,
    estimated_end: float | None = None,
    borrowed: bool = False,
    free_stop_grace_s: float | None = None,
) -> Explanation:
    """``free_stop_grace_s``: set for free work, the time it gets to save when stopped."""
    parts = [f"running on {', '.join(nodes)}"]
    if stopping is not None:
        parts.append(f"being stopped ({stopping.value})")
    elif free_stop_grace_s is not None:
        parts.append(
            "free work: other work may take its GPUs at any moment, "
            f"{free_stop_grace_s:g} s after asking it to stop (SIGTERM)"
        )
    elif borrowed:
        parts.append(
            f"on GPUs borrowed beyond {allocation}'s share: its minimum runtime does not "
            "protect it there, and a team below its share may take them back"
        )
    elif protected_until is not None and protected_until > now:
        parts.append(f"protected by its contract for {protected_until - now:.0f} s more")
    else:
        parts.append("past its minimum runtime: preemptible when higher-ranked work waits")
    if stopping is None and estimated_end is not None and estimated_end > now:
        parts.append(f"estimated to end in {estimated_end - now:.0f} s")
    parts.append(_standing_text(allocation, standing))
    return Explanation(job_id, False, allocation, standing, 0, "; ".join(parts))


def _standing_text(allocation: str, standing: Standing | None) -> str:
    if standing is None:
        return f"{allocation} is not in the budget tree"
    return (
        f"{allocation} ranks {standing.rank} of {standing.of} by fair share "
        f"(usage/entitlement {standing.ratio:.2f})"
    )
