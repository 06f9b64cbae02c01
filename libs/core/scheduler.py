"""The budget scheduler: a deterministic state machine driven by its input log.

``handle`` is the fold followed by the cycle: ``fold.apply`` applies one input (and
the time it brings) to the declared state (``facts.py``) and validates it, and
``cycle.run`` does what the state now allows, in numbered steps, a module each
(``cycle/``: serving arbitration, nominate, admit, preempt, tell). The placement
service, the simulator and the audit replayer all drive this class, so the same
inputs always yield the same decisions and digests. Iteration follows insertion
order (the input order) or sorted keys, never hash order; time comes only from the
inputs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

from libs.core import cycle, fold, inputs
from libs.core.approvals import ApprovedKey
from libs.core.capacity import Fit
from libs.core.config import PolicyConfig
from libs.core.cycle import arbitrate
from libs.core.decisions import Decision
from libs.core.explain import Explanation, explain_running, explain_serving, explain_waiting
from libs.core.facts import Facts
from libs.core.ids import JobId, NodeId, TaskId
from libs.core.model import JobSpec, NodeSpec
from libs.core.running import Running
from libs.core.service_level import Asking, Occupancy, waiting_and_asked

POLICY = "budget"
# What each version changed: docs/policy-versions.md. A change that alters any
# decision for the same input bumps it and adds its line there.
POLICY_VERSION = 36


class Scheduler:
    """The state machine over ``Facts``: every attribute it has is the config or the
    facts, whose parts declare what it remembers (tables and cells the digest covers
    by construction)."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._facts = Facts(self.config)

    @property
    def now(self) -> float:
        """The input clock: the largest ``at`` of the log so far."""
        return self._facts.now

    def handle(self, event: inputs.Input) -> list[Decision]:
        """Fold one input and run the cycle; never raises: an input it cannot act on
        is answered with a ``Reject`` (a job) or a ``Refused`` (anything else), and
        changes nothing."""
        return cycle.run(self._facts, fold.apply(self._facts, event))

    def serving_gpus(self) -> int:
        """GPUs held for workflows now (taken from batch work)."""
        return arbitrate.serving_gpus(self._facts)

    def serving_stalled(self) -> bool:
        """Whether the serving pool is backed up and found no job it may stop
        (``arbitrate.stalled``)."""
        return arbitrate.stalled(self._facts)

    def free_gpus(self) -> tuple[int, int]:
        """Free GPUs now: those on nodes kept for a waiting job (being freed for it, or
        earmarked until it starts), and the others."""
        capacity = self._facts.capacity
        kept = sum(len(capacity.free(node_id)) for node_id in self._facts.reservations.reserved)
        return kept, capacity.total_free - kept

    def nodes(self) -> Mapping[NodeId, NodeSpec]:
        """The nodes work may be placed on (registered, not lost), as it judges them."""
        return dict(self._facts.capacity.nodes)

    def occupancy(self) -> Occupancy:
        """The cluster as the service levels count it (``service_level``), from this
        state: the console and the projector's metrics count the same from the views."""
        facts = self._facts
        room: Counter[str] = Counter()
        for node in facts.capacity.nodes.values():
            room[node.gpu_type] += node.gpu_count
        batch = (facts.queues.jobs, facts.held, facts.dependencies.blocked)
        specs = (job.spec for job in itertools.chain.from_iterable(t.values() for t in batch))
        waiting, asked = waiting_and_asked(
            (
                Asking(spec.allocation, spec.allocated, spec.gpus, spec.gpu_type)
                for spec in itertools.chain(specs, facts.serving.waiting.values())
            ),
            room,
        )
        held = arbitrate.held_by_allocation(facts)
        for run in facts.running.jobs.values():
            if run.spec.allocated:
                tasks = (t for t in run.tasks.items() if t[0] not in run.ended)
                held[run.spec.allocation] += sum(len(gpus) for _, (_, gpus) in tasks)
        capacity = sum(room.values())
        busy = capacity - facts.capacity.total_free
        return Occupancy(capacity, busy, waiting, dict(+held), asked)

    def node_key(self, node_id: str) -> ApprovedKey | None:
        """The node's key as operators approved (or revoked) it; None: never approved."""
        return self._facts.node_keys.get(NodeId(node_id))

    def task_node(self, job_id: str, task_id: str) -> str | None:
        """The node a running batch task was placed on; None when none runs so."""
        run = self._facts.running.jobs.get(JobId(job_id))
        task = run.tasks.get(TaskId(task_id)) if run is not None else None
        return task[0] if task is not None else None

    def estimate_s(self, spec: JobSpec) -> float | None:
        """How long a job is expected to run, for planning (never for charging): its
        requested limit, else its user's learned figure, else None."""
        return self._facts.learned.estimate_s(spec)

    def digest(self) -> bytes:
        """A fingerprint of the whole declared state, recorded with every decision."""
        return self._facts.state.digest()

    def recomputed_digest(self) -> bytes:
        """The digest hashed afresh from every declared fact (for tests: slow)."""
        return self._facts.state.recomputed()

    def explain(self, job_id: JobId) -> Explanation | None:
        """Why a job waits (or where it runs), computed from the current state."""
        facts = self._facts
        standing = facts.charges.standings(facts.now).get
        serving = facts.serving.describe(job_id, facts.now_ms)
        if serving is not None:
            allocation = facts.serving.allocation_of(job_id)
            waiting = job_id in facts.serving.waiting
            return explain_serving(job_id, allocation, standing(allocation), serving, waiting)
        held = facts.held.get(job_id) or facts.dependencies.blocked.get(job_id)
        if held is not None:
            return explain_waiting(
                held,
                standing(held.spec.allocation),
                reason=reason.words() if (reason := facts.reasons.get(job_id)) else "held",
                ahead=0,
                reserved=None,
                starts_at=None,
                now=self.now,
            )
        job = facts.queues.jobs.get(job_id)
        if job is not None:
            fit = facts.capacity.fit(job.spec, facts.reservations.blocked_for(job_id))
            return explain_waiting(
                job,
                standing(job.spec.allocation),
                reason=fit.reason if not isinstance(fit, Fit) else "fits now: next in line",
                ahead=facts.queues.ahead_of(job, facts.charges.rank(facts.now)),
                reserved=facts.reservations.nominated.get(job_id),
                starts_at=facts.reservations.earmarks.get(job_id),
                now=self.now,
            )
        run = facts.running.jobs.get(job_id)
        if run is not None:
            return explain_running(
                job_id,
                run.spec.allocation,
                standing(run.spec.allocation),
                nodes=sorted({node for node, _ in run.tasks.values()}),
                protected_until=run.protected_until(self.config),
                borrowed=run.unprotected_borrower(self.config),
                free_stop_grace_s=None if run.spec.allocated else self.config.free_stop_grace_s,
                now=self.now,
                stopping=run.stopping,
                estimated_end=self._estimated_end(run),
            )
        return None

    @staticmethod
    def _estimated_end(run: Running) -> float | None:
        """By the estimate it was placed with: the one holds plan with."""
        if run.started_at is None or run.estimate_s is None:
            return None
        return run.started_at + run.estimate_s
