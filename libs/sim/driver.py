"""The trace simulator: one policy, the simulated cluster (``libs.sim.world``), its clock.

At equal times, what is due now (the inputs a decision caused, as the node agents report
them) runs first, then tasks end, then cancellations, submissions, usage snapshots and
ticks, each in the order made, so a run is a pure function of the workload, the policy and
the settings. Every input goes through ``Policy.handle``; the simulated node agents
(``libs.sim.batch``) act on its decisions, and a ``Place`` must name free GPUs (a GPU given
twice is a policy bug and stops the run). Usage snapshots come from ``WindowedUsage`` fed
with the task lifecycle, as the projector computes them, every ``snapshot_s``; ticks every
``tick_s``. Both are skipped while nothing waits (nothing to decide), and a submission
after such a lull gets a fresh snapshot first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from libs.core.config import DAY
from libs.core.ids import JobId
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    NodeJoined,
    Tick,
)
from libs.core.usage import WindowedUsage
from libs.sim.batch import BatchAgents, Completion, StopEnd
from libs.sim.policy import Policy
from libs.sim.recorder import Metrics, Recorder, gpus_of_type
from libs.sim.workload import SimJob, Workload
from libs.sim.world import SimulationError, World, usage_snapshot

# Ranks at equal times, after what is due now (0).
_RANKS = {Completion: 1, StopEnd: 2}
_CANCEL, _ARRIVE, _SNAPSHOT, _TICK = 3, 4, 5, 6
PROGRESS_STEPS = 200  # calls of a progress callback per run, at most

Progress = Callable[[float], None]  # the share of the simulated span done, 0 to 1

__all__ = ["SimSettings", "SimulationError", "simulate"]


class _Snapshot:
    """Time for a usage snapshot."""


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
    enough_demand: float = 0.5  # see libs.sim.recorder
    checkpoint_s: float = 0.0  # how often resumable work checkpoints; see libs.sim.batch


class Simulation:
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        settings: SimSettings,
        name: str = "",
        on_progress: Progress | None = None,
    ) -> None:
        self.workload = workload
        self.on_progress = on_progress
        self.policy = policy
        self.settings = settings
        self.name = name or type(policy).__name__
        jobs = workload.jobs
        self.start = jobs[0].at if jobs else 0.0
        self.end = (jobs[-1].at if jobs else 0.0) + settings.drain_s
        self.recorder = Recorder(
            workload.capacity,
            workload.tree.entitlements(),
            min(self.start + settings.warmup_s, self.end),
            self.end,
            settings.sample_s,
            settings.enough_demand,
            gpus_of_type=gpus_of_type(workload.nodes),
        )
        self.usage = WindowedUsage(settings.lookback_window_s)
        self.inputs = 0
        self.world = World(stop_grace_s=settings.stop_grace_s, ranks=_RANKS)
        self.world.now = self.start
        self.agents = BatchAgents(self.world, self.recorder, settings.checkpoint_s)
        self._last_snapshot = -float("inf")

    def run(self) -> Metrics:
        world, recorder, settings, agents = self.world, self.recorder, self.settings, self.agents
        self._feed(BudgetSet(self.start, self.workload.tree))
        prices = dict(settings.gpu_prices)
        for node in self.workload.nodes:
            world.join(node, prices.get(node.gpu_type, 1.0))
            self._feed(NodeJoined(self.start, node))
        for job in self.workload.jobs:
            world.at(job.at, job, _ARRIVE)
        for at, job_id in self.workload.cancels:
            world.at(at, CancelRequested(at, JobId(job_id)), _CANCEL)
        world.at(self.start, _Snapshot(), _SNAPSHOT)
        world.at(self.start, Tick(self.start), _TICK)
        span = self.end - self.start
        report = self.start if self.on_progress and span > 0 else float("inf")
        while (next_at := world.next_at()) is not None and next_at[0] <= self.end:
            entry = world.pop()
            recorder.advance(world.now)
            if world.now >= report and self.on_progress:
                self.on_progress((world.now - self.start) / span)
                report = world.now + span / PROGRESS_STEPS
            match entry:
                case SimJob():
                    self._arrive(entry)
                case _Snapshot():
                    world.at(world.now + settings.snapshot_s, entry, _SNAPSHOT)
                    if agents.waiting:
                        self._snapshot()
                case Tick():
                    world.at(world.now + settings.tick_s, Tick(world.now + settings.tick_s), _TICK)
                    if agents.waiting:
                        self._feed(entry)
                case _ if isinstance(entry, Input):
                    self._feed(entry)
                case _:
                    self._step(entry)
        return recorder.finish(agents.jobs.values(), self.name, self.inputs)

    def _arrive(self, sim: SimJob) -> None:
        if not self.agents.arrive(sim):
            return
        now = self.world.now
        if now - self._last_snapshot >= self.settings.snapshot_s:
            self._snapshot()
        self._feed(JobArrived(now, JobId(sim.job_id), sim.spec))

    def _snapshot(self) -> None:
        now = self._last_snapshot = self.world.now
        self._feed(usage_snapshot(self.usage, now, self.settings.lookback_window_s))

    # --- the policy ---

    def _feed(self, event: Input) -> None:
        """``event`` and everything due now it causes, before anything else happens."""
        world = self.world
        self._step(event)
        while (next_at := world.next_at()) is not None and next_at == (world.now, 0):
            self._step(world.pop())

    def _step(self, entry: object) -> None:
        """An input for the policy, whose decisions the agents act on, or an agents' event."""
        if isinstance(entry, Input):
            self.inputs += 1
            self.world.charge(self.usage, entry)
            for decision in self.policy.handle(entry):
                self.agents.decide(decision)
        else:
            self.agents.handle(entry)  # type: ignore[arg-type]


def simulate(
    workload: Workload,
    policy: Policy,
    settings: SimSettings | None = None,
    *,
    name: str = "",
    on_progress: Progress | None = None,
) -> Metrics:
    """``on_progress`` hears how far the run is, as simulated time advances."""
    return Simulation(workload, policy, settings or SimSettings(), name, on_progress).run()
