"""Exactly one job per client request id, decided from the log.

A request with a client request id names its job (``job_id_for``). Before
answering it, admission appends a claim (the ``JobSubmitted``) and reads the log
up to it: the first claim of a job id in the log wins, and only the request that
wrote it decides the job (``JobAdmitted`` or ``JobRejected``). Every other request
with that id (a retry after a timeout, a duplicate racing on this instance or on
another) answers what the log says the winner decided: the same job, or the same
rejection. No projection is asked, so this holds while the projector is down.

The log is the events topic, read by admission's follower; this is the index of
what it says about each job id, for the most recent ``remember`` job ids.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from qm.v1 import events_pb2, types_pb2

from libs.events import event_type
from libs.trust import Gate

REMEMBER = 500_000  # request ids are for retries, which come within minutes


@dataclass(frozen=True)
class Outcome:
    """What the log says admission decided for a job."""

    admitted: bool
    status: str = ""  # the status a rejection was answered with, e.g. INVALID_ARGUMENT
    field: str = ""
    reason: str = ""


@dataclass
class Claim:
    """The first claim of a job id in the log, and what became of it."""

    event_id: str
    spec: types_pb2.JobSpec
    seen_at: float  # monotonic, when this instance read it
    outcome: Outcome | None = None


_FOLDED = frozenset({"job_submitted", "job_admitted", "job_rejected"})


class RequestLog:
    """``gate``: claims and decisions are believed only when admission signed them (a
    node agent's account may write the topic too); None believes every one (tests)."""

    def __init__(self, remember: int = REMEMBER, gate: Gate | None = None) -> None:
        self._remember = remember
        self._gate = gate
        self._jobs: OrderedDict[str, Claim] = OrderedDict()
        self._undecided: dict[str, None] = {}  # job ids of claims without a decision, as read
        self._decided = asyncio.Event()

    def apply(self, env: events_pb2.Envelope, record: bytes) -> None:
        """Fold one record of the events topic."""
        kind = event_type(env)
        if kind not in _FOLDED or (self._gate and not self._gate.from_service(env, record)):
            return
        match kind:
            case "job_submitted":
                submitted = env.job_submitted
                if submitted.job_id not in self._jobs:
                    self._keep(
                        submitted.job_id, Claim(env.event_id, submitted.spec, time.monotonic())
                    )
                    self._undecided[submitted.job_id] = None
            case "job_admitted":
                self._decide(env.job_admitted.job_id, Outcome(admitted=True))
            case "job_rejected":
                r = env.job_rejected
                status = r.status or "INVALID_ARGUMENT"
                self._decide(r.job_id, Outcome(False, status, r.field, r.reason))

    def claim(self, job_id: str) -> Claim | None:
        return self._jobs.get(job_id)

    def undecided(self, older_than_s: float) -> list[tuple[str, Claim]]:
        """The claims read more than ``older_than_s`` ago that nothing has decided yet,
        oldest first."""
        oldest = time.monotonic() - older_than_s
        found = []
        for job_id in self._undecided:  # in the order they were read
            claim = self._jobs[job_id]
            if claim.seen_at > oldest:
                break
            found.append((job_id, claim))
        return found

    async def outcome(self, job_id: str) -> Outcome:
        """What the log says was decided for ``job_id``, once it says so."""
        while True:
            claim = self._jobs.get(job_id)
            if claim is not None and claim.outcome is not None:
                return claim.outcome
            decided = self._decided
            await decided.wait()

    def take(self, job_id: str) -> bool:
        """This instance is to decide an undecided claim whose request died: False when
        the log has its decision, or something here (the sweep, another retry of the
        request) took it already. Taken before the first await, so only one decides."""
        if job_id not in self._undecided:
            return False
        del self._undecided[job_id]
        return True

    def give_back(self, job_id: str) -> None:
        """A take that wrote no decision (a dependency was down): the next sweep tries."""
        claim = self._jobs.get(job_id)
        if claim is not None and claim.outcome is None:
            self._undecided[job_id] = None

    def _decide(self, job_id: str, outcome: Outcome) -> None:
        claim = self._jobs.get(job_id)
        if claim is None:  # a rejection written without a claim (a spec too large to log)
            claim = self._keep(job_id, Claim("", types_pb2.JobSpec(), time.monotonic()))
        if claim.outcome is None:  # the first decision stands
            claim.outcome = outcome
        self._undecided.pop(job_id, None)
        decided, self._decided = self._decided, asyncio.Event()
        decided.set()

    def _keep(self, job_id: str, claim: Claim) -> Claim:
        self._jobs[job_id] = claim
        if len(self._jobs) > self._remember:
            forgotten, _ = self._jobs.popitem(last=False)
            self._undecided.pop(forgotten, None)
        return claim
