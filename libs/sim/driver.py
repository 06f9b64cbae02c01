"""The discrete-event simulator: one policy, simulated nodes, a simulated clock.

Events sit on a heap ordered by (time, kind, sequence); at equal times, tasks
end before cancellations, cancellations before submissions, and usage
snapshots before ticks, and otherwise first pushed runs first, so a run is a
pure function of the workload, the policy and the settings. Every input goes
through ``Policy.handle``; the simulated node agents (``libs.sim.batch``)
act on its decisions, and a ``Place`` must name free GPUs (a GPU given twice
is a policy bug and stops the run). Usage snapshots come from
``WindowedUsage`` fed with the task lifecycle, as the projector computes
them, every ``snapshot_s``; ticks every ``tick_s``. Both are skipped while
nothing waits (nothing to decide), and a submission after such a lull gets a
fresh snapshot first.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from libs.core.config import DAY
from libs.core.decisions import Place
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    NodeJoined,
    TaskEnded,
    TaskStarted,
    Tick,
    UsageSnapshot,
)
from libs.core.usage import WindowedUsage
from libs.sim.batch import (
    PLACING,
    RUNNING,
    STOPPED,
    STOPPING,
    AgentEvent,
    BatchAgents,
    Completion,
    Task,
)
from libs.sim.metrics import JobOutcome, Metrics, Recorder
from libs.sim.policy import Policy
from libs.sim.workload import SimJob, Workload

# Event kinds, in the order they run at equal times.
_COMPLETE, _STOP_END, _CANCEL, _ARRIVE, _SNAPSHOT, _TICK = range(6)


class SimulationError(RuntimeError):
    """The policy broke a rule no scheduler may break; the message says which."""


@dataclass(frozen=True)
class SimSettings:
    tick_s: float = 60.0
    # A snapshot costs O(running tasks) in WindowedUsage; every 5 minutes keeps it to a few
    # percent of a run, and a 7-day fair-share window moves little in 5 minutes.
    snapshot_s: float = 300.0
    stop_grace_s: float = 30.0
    lookback_window_s: float = 7 * DAY  # the snapshots' window: the policy's lookback
    gpu_prices: tuple[tuple[str, float], ...] = ()  # the policy's price table
    drain_s: float = 0.0  # keep simulating this long after the last submission
    # Measure from this long after the first submission: an emptied cluster takes a while to
    # fill, and that ramp says nothing about the policy. Jobs submitted before are not measured.
    warmup_s: float = 0.0
    sample_s: float = 600.0  # time-series resolution for plots
    enough_demand: float = 0.5  # see libs.sim.metrics


class Simulation:
    def __init__(
        self, workload: Workload, policy: Policy, settings: SimSettings, name: str = ""
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.settings = settings
        self.name = name or type(policy).__name__
        jobs = workload.jobs
        self.start = jobs[0].at if jobs else 0.0
        self.end = (jobs[-1].at if jobs else 0.0) + settings.drain_s
        self.now = self.start
        self.recorder = Recorder(
            workload.capacity,
            workload.tree.entitlements(),
            min(self.start + settings.warmup_s, self.end),
            self.end,
            settings.sample_s,
            settings.enough_demand,
        )
        self.usage = WindowedUsage(settings.lookback_window_s)
        self.inputs = 0
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._pending: deque[Input] = deque()
        self.agents = BatchAgents(self, self.recorder, settings.stop_grace_s, SimulationError)
        self._busy: dict[str, list[bool]] = {}
        self._price: dict[str, float] = {}  # per node: what its GPU-seconds cost
        self._last_snapshot = -float("inf")

    def run(self) -> Metrics:
        self._feed(BudgetSet(self.start, self.workload.tree))
        for node in self.workload.nodes:
            self._busy[node.node_id] = [False] * (max(node.gpu_indices, default=-1) + 1)
            self._price[node.node_id] = dict(self.settings.gpu_prices).get(node.gpu_type, 1.0)
            self._feed(NodeJoined(self.start, node))
        for job in self.workload.jobs:
            self._push(job.at, _ARRIVE, job)
        for at, job_id in self.workload.cancels:
            self._push(at, _CANCEL, job_id)
        self._push(self.start, _SNAPSHOT, None)
        self._push(self.start, _TICK, None)
        heap, recorder, settings, agents = self._heap, self.recorder, self.settings, self.agents
        while heap and heap[0][0] <= self.end:
            at, kind, _, payload = heapq.heappop(heap)
            self.now = at
            recorder.advance(at)
            if kind in (_COMPLETE, _STOP_END):
                agents.handle(payload)  # type: ignore[arg-type]
                self._drain()
            elif kind == _ARRIVE:
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == _CANCEL:
                self._feed(CancelRequested(at, payload))  # type: ignore[arg-type]
            elif kind == _SNAPSHOT:
                self._push(at + settings.snapshot_s, _SNAPSHOT, None)
                if agents.waiting:
                    self._snapshot()
            else:
                self._push(at + settings.tick_s, _TICK, None)
                if agents.waiting:
                    self._feed(Tick(at))
        return recorder.finish(self._outcomes(), self.name, self.inputs)

    # --- events ---

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, kind, self._seq, payload))

    def _arrive(self, sim: SimJob) -> None:
        if not self.agents.arrive(sim):
            return
        if self.now - self._last_snapshot >= self.settings.snapshot_s:
            self._snapshot()
        self._feed(JobArrived(self.now, sim.job_id, sim.spec))

    def _snapshot(self) -> None:
        self._last_snapshot = self.now
        usage = self.usage.snapshot(self.now)
        self._feed(
            UsageSnapshot(
                self.now,
                self.settings.lookback_window_s,
                tuple((name, u.allocated_gpu_s) for name, u in usage.items()),
            )
        )

    # --- the policy ---

    def _feed(self, event: Input) -> None:
        self._pending.append(event)
        self._drain()

    def _drain(self) -> None:
        """Feed every pending input, including those the decisions cause, in order."""
        pending, handle, apply = self._pending, self.policy.handle, self.agents.decide
        while pending:
            self.inputs += 1
            for decision in handle(pending.popleft()):
                apply(decision)

    # --- the node agents' host ---

    def take_gpus(self, place: Place) -> None:
        busy = self._busy.get(place.node_id)
        if busy is None:
            raise SimulationError(f"{place.task_id}: placed on unknown node {place.node_id}")
        for gpu in place.gpu_indices:
            if gpu >= len(busy) or busy[gpu]:
                raise SimulationError(f"{place.task_id}: GPU {gpu} of {place.node_id} is not free")
            busy[gpu] = True

    def free_gpus(self, task: Task) -> None:
        busy = self._busy[task.node_id]
        for gpu in task.gpus:
            busy[gpu] = False

    def started(self, event: TaskStarted, task: Task) -> None:
        spec = task.job.sim.spec
        self.usage.start(
            event.task_id,
            spec.allocation,
            len(task.gpus),
            allocated=spec.allocated,
            at=event.at,
            price=self._price[task.node_id],
        )
        self._pending.append(event)

    def ended(self, event: TaskEnded) -> None:
        """The policy hears of it with the pending inputs."""
        self.usage.end(event.task_id, event.at)
        self._pending.append(event)

    def schedule(self, at: float | None, event: AgentEvent) -> None:
        if at is None:
            self.agents.handle(event)
        else:
            self._push(at, _COMPLETE if isinstance(event, Completion) else _STOP_END, event)

    def _outcomes(self) -> list[JobOutcome]:
        shown = {PLACING: RUNNING, STOPPING: STOPPED}
        return [
            JobOutcome(
                arrived=job.sim.at,
                spec=job.sim.spec,
                runtime_s=job.sim.runtime_s,
                first_start=job.first_start,
                finished=job.finished,
                preemptions=job.preemptions,
                outcome=shown.get(job.state, job.state),
            )
            for job in self.agents.jobs.values()
        ]


def simulate(
    workload: Workload, policy: Policy, settings: SimSettings | None = None, *, name: str = ""
) -> Metrics:
    return Simulation(workload, policy, settings or SimSettings(), name).run()
