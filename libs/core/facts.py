"""What the budget scheduler remembers: the declared state, by parts, that the fold
writes and every step of the cycle reads.

Free GPUs (``capacity.py``), the queues (``queues.py``), running work (``running.py``),
what allocations are charged (``charges.py``), preemption under way
(``reservations.py``), node leases (``liveness.py``), each user's completed runtimes
(``estimates.py``), jobs that wait for others (``dependencies.py``), workflows
(``compass``), and a few tables of the scheduler's own. Every attribute is a table or
cell of one ``State`` (so the digest covers it by construction), a part that declares
its own, the config, or the input clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from libs.core.approvals import ApprovedKey
from libs.core.capacity import Capacity
from libs.core.charges import Charges
from libs.core.compass.pool import Want
from libs.core.compass.serving import GpuKey, Serving
from libs.core.config import PolicyConfig
from libs.core.dependencies import Dependencies
from libs.core.estimates import LearnedRuntimes
from libs.core.ids import JobId, NodeId
from libs.core.liveness import Liveness
from libs.core.model import JobSpec, NodeSpec
from libs.core.queues import Queues, Waiting
from libs.core.reservations import Reservations
from libs.core.running import RunningWork
from libs.core.state import Cell, State, Table
from libs.core.wait_reasons import WaitReason


class Reclaim(NamedTuple):
    """A job stopped for a backed-up serving pool, and whose workflows backed it up."""

    job_id: JobId
    allocation: str


class Lender:
    """Serving's narrow view of the batch capacity (``serving.BatchGpus``): it takes
    free GPUs and gives them back, never on nodes reserved for a preempting job."""

    def __init__(self, capacity: Capacity, reserved: Table[NodeId, tuple[JobId, float]]) -> None:
        self._capacity = capacity
        self._reserved = reserved

    @property
    def total_gpus(self) -> int:
        return self._capacity.total_gpus

    @property
    def total_free(self) -> int:
        return self._capacity.total_free

    def node(self, node_id: NodeId) -> NodeSpec | None:
        return self._capacity.nodes.get(node_id)

    def free_gpus(self) -> Iterator[GpuKey]:
        for node_id in self._capacity.nodes:
            if node_id not in self._reserved and not self._capacity.is_cordoned(node_id):
                for index in self._capacity.free(node_id):
                    yield node_id, index

    def schedulable(self, spec: JobSpec) -> Mapping[NodeId, int]:
        return self._capacity.schedulable(spec)

    def take(self, key: GpuKey) -> None:
        self._capacity.take(key[0], (key[1],))

    def give(self, key: GpuKey) -> None:
        self._capacity.give(key[0], (key[1],))


class Facts:
    """The state the scheduler folds its inputs into. The parts are public: the fold
    and the cycle's steps (``fold.py``, ``cycle/``) are functions over them."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.now = 0.0  # the input clock: the largest ``at`` of the log so far
        state = self.state = State()
        self.capacity = Capacity(state)
        self.queues = Queues(state)
        self.running = RunningWork(config, state)
        self.charges = Charges(config, state, self.capacity)
        self.reservations = Reservations(config, state)
        self.learned = LearnedRuntimes(state)
        self.dependencies = Dependencies(state)
        self.liveness = Liveness(config, state)
        # The last reason each job heard that it waits.
        self.reasons: Table[JobId, WaitReason] = state.table("reasons", WaitReason.fact)
        # Each node's key as operators approved it (the gate checks its records with it).
        self.node_keys: Table[NodeId, ApprovedKey] = state.table("node_keys", ApprovedKey.fact)
        self.seen: Table[JobId, None] = state.table("seen")  # every job id decided on
        self.seq = state.cell("seq", 0)  # submission order
        self.impossible: Table[JobId, None] = state.table("impossible")  # no node can ever hold
        # Waiting jobs their users hold back: out of the queues, each keeping its place
        # in line (its sequence number) for when it is released.
        self.held: Table[JobId, Waiting] = state.table("held", Waiting.fact)
        # Workflows (DAGs of model-serving tasks) are planned by the serving core, in
        # tables of its own, on GPUs it borrows from the batch capacity.
        self.serving = Serving(config, state, Lender(self.capacity, self.reservations.reserved))
        # The job stopped to give a backed-up serving pool GPUs (``cycle/arbitrate.py``),
        # and for which allocation; and what the pool wanted when no running job could be
        # stopped for it, with the running work's version then: not looked for again
        # until either changes.
        self.reclaiming: Cell[Reclaim | None] = state.cell("serving.reclaiming", None)
        self.no_victim: Cell[tuple[Want, int] | None] = state.cell("serving.no_victim", None)

    @property
    def now_ms(self) -> float:
        """The input clock in milliseconds, serving's unit."""
        return self.now * 1000

    def dequeue(self, job_id: JobId) -> Waiting | None:
        """Take a job out of the queues, with what was kept for it while it waited."""
        job = self.queues.remove(job_id)
        if job is not None:
            self.reasons.pop(job_id)
            self.impossible.pop(job_id)
            self.reservations.release(job_id)
        return job
