"""Mixed clusters: batch jobs and workflows share one cluster under one budget.

One discrete-event run drives exactly the core ``Scheduler`` (its batch tiers
and its serving core) the way the live stack does, over the workload of
``libs.sim.mixed_workload``:

* the cluster (16 × 8 H100 by default) joins at time 0 under a budget tree of
  two batch teams and one serving team; batch jobs arrive from time 0;
* after ``warmup_s`` of batch work alone (the cluster is full, as it would be),
  the measured window opens and the serving team's workflows arrive, faster
  during the burst phase ("daytime");
* the tasks run in the simulated cluster (``libs.sim.world``, in ms): batch
  jobs through its batch agents (``libs.sim.batch``: a task ends after its
  runtime, or ``stop_grace_s`` after a ``Stop``), workflow tasks through its
  GPU workers (``MixedCluster`` is a ``libs.sim.workflows.ServingCluster`` with
  batch work on the side); a batch task that lands
  on a GPU that caches models evicts them first, as the node agent does;
* ``UsageSnapshot`` every ``snapshot_s`` from ``WindowedUsage`` fed with every
  batch task's start and end and every GPU serving holds, from ``ServingHeld``
  to ``ServingReleased`` (as the projector charges them), and a ``Tick`` every
  ``tick_s``.

After the window closes no more work arrives; the run goes on until every
job and workflow has finished (waits are measured up to the window's end, as
``libs.sim.recorder`` does). The world checks on the way that no GPU ever runs
batch and serving work at once. Deterministic: seeded generators, and events
at equal times in the order they were made. ``libs.sim.mixed_report`` shows a run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from libs.core.compass import CacheModel
from libs.core.config import PolicyConfig
from libs.core.decisions import Cancel, Decision, Planned, ServingHeld, ServingReleased, Wait
from libs.core.ids import JobId
from libs.core.inputs import (
    BudgetSet,
    Input,
    JobArrived,
    NodeJoined,
    TaskEnded,
    TaskStarted,
    Tick,
)
from libs.core.model import JobSpec
from libs.core.scheduler import Scheduler
from libs.core.service_level import workflow_slowdown
from libs.core.usage import Usage, WindowedUsage
from libs.sim.batch import OVER, BatchAgents, Completion, EndTask, Job, Observer, StopEnd
from libs.sim.mixed_results import (
    PHASES,
    Charge,
    Held,
    MixedRun,
    Sample,
    SeedRuns,
    Slowdowns,
)
from libs.sim.mixed_workload import (
    SERVING_TEAM,
    MixedSettings,
    batch_jobs,
    budget_tree,
    workflow_arrivals,
)
from libs.sim.recorder import CLASSES, Distribution
from libs.sim.workflows import Profiles, ServingCluster, hit_rate, hits, keyed, serving_policy
from libs.sim.workload import SimJob
from libs.sim.world import SimulationError, usage_snapshot

# -- the run ---------------------------------------------------------------------------


class _Steps:
    """A value that changes at times: time-weighted statistics over windows."""

    def __init__(self) -> None:
        self.times: list[float] = [0.0]
        self.values: list[int] = [0]

    def set(self, at: float, value: int) -> None:
        if value == self.values[-1]:
            return
        if at == self.times[-1]:
            self.values[-1] = value
        else:
            self.times.append(at)
            self.values.append(value)

    def _spans(self, window: tuple[float, float]) -> Iterator[tuple[int, float]]:
        """Each value in turn with how long it held within ``window`` [start, end)."""
        start, end = window
        for i, value in enumerate(self.values):
            until = self.times[i + 1] if i + 1 < len(self.times) else math.inf
            span = min(until, end) - max(self.times[i], start)
            if span > 0:
                yield value, span

    def weights(self, windows: Sequence[tuple[float, float]]) -> dict[int, float]:
        """Value -> how long it held within the windows."""
        weight: dict[int, float] = {}
        for window in windows:
            for value, span in self._spans(window):
                weight[value] = weight.get(value, 0.0) + span
        return weight

    def longest(self, value: int, window: tuple[float, float]) -> float:
        """The longest unbroken span within ``window`` that held ``value``."""
        longest = run = 0.0
        for held, span in self._spans(window):
            run = run + span if held == value else 0.0
            longest = max(longest, run)
        return longest

    def over(self, windows: Sequence[tuple[float, float]]) -> Held:
        weight = self.weights(windows)
        total = sum(weight.values())
        if not total:
            return Held(0.0, 0.0, 0.0, 0.0)

        def quantile(q: float) -> float:
            seen = 0.0
            for value in sorted(weight):
                seen += weight[value]
                if seen >= q * total - 1e-9:
                    return float(value)
            return float(max(weight))  # pragma: no cover - the loop reaches the total

        mean = sum(v * w for v, w in weight.items()) / total
        return Held(quantile(0.5), quantile(0.9), float(max(weight)), mean)


@dataclass(frozen=True)
class _Timer:
    """A usage snapshot, a tick or a sample is due, or the window opens or closes."""

    kind: str


class MixedCluster(ServingCluster, Observer):
    """The serving cluster with batch jobs on the side, and what a run of it measures (it
    observes the batch agents: the GPUs batch work holds, by class and over time)."""

    def __init__(
        self,
        profiles: Profiles,
        config: PolicyConfig,
        settings: MixedSettings,
        *,
        workflows: bool = True,
    ) -> None:
        super().__init__([Scheduler(config)], profiles.costs, self._decided, settings.stop_grace_s)
        self.settings = settings
        self.config = config
        self.best_case_ms = profiles.best_case_ms
        self.tree = budget_tree(settings.teams)
        self.usage = WindowedUsage(config.lookback_window_s)
        nodes = settings.cluster.node_specs()
        self.capacity = sum(n.gpu_count for n in nodes)
        self.cap = math.ceil(config.serving_max_fraction * self.capacity)
        self.start, self.end = settings.warmup_s, settings.end_s
        rng = random.Random(f"mixed/{settings.seed}")
        flows = [keyed(w) for w in profiles.workflows]
        self.batch = batch_jobs(settings, rng)  # first: the same jobs with workflows or not
        self.arrivals = workflow_arrivals(settings, flows, rng) if workflows else []
        self.agents = BatchAgents(self.world, self)
        self.batch_by_class = dict.fromkeys(CLASSES, 0)
        self.batch_steps = _Steps()
        self.preemptions = 0
        self.running: dict[str, tuple[str, int, float]] = {}  # task -> allocation, GPUs, start
        self.gpu_s_run: dict[str, float] = {}
        self.serving_run_s = 0.0  # workflow task time inside the window
        self.waited: set[str] = set()
        self.serving_steps = _Steps()
        self.kept_steps = _Steps()
        self.other_steps = _Steps()
        self.stalled_steps = _Steps()
        self.peak_held = 0
        self.peak_active = 0
        self.samples: list[Sample] = []
        self.inputs = 0
        self.marks: dict[str, dict[str, Usage]] = {}  # window start/end -> usage

    # -- driving ---------------------------------------------------------------------

    def simulate(self) -> MixedRun:
        began = time.perf_counter()
        world = self.world
        self.feed(BudgetSet(0.0, self.tree))
        for node in self.settings.cluster.node_specs():
            self.feed(NodeJoined(0.0, node))
            world.join(node)
        for job in self.batch:
            world.at(job.at * 1000, job)
        for n, (at, flow) in enumerate(self.arrivals):
            ms = (self.start + at) * 1000
            spec = JobSpec(SERVING_TEAM, "sim", 1, (), workflow=flow)
            world.at(ms, JobArrived(ms / world.per_s, JobId(f"w{n:06d}"), spec))
        for kind in ("snapshot", "tick"):
            world.at(0.0, _Timer(kind))
        world.at(self.start * 1000, _Timer("start"))
        world.at(self.start * 1000, _Timer("sample"))
        world.at(self.end * 1000, _Timer("end"))
        self.run(self._handle)
        if left := [j for j in self.jobs.values() if j.state not in OVER]:
            raise SimulationError(
                f"{len(left)} batch jobs never finished, e.g. {left[0].sim.job_id}"
            )
        return dataclasses.replace(self._result(), wall_s=time.perf_counter() - began)

    @property
    def now(self) -> float:
        return self.world.now_s

    @property
    def jobs(self) -> dict[str, Job]:
        """The batch jobs, by id."""
        return self.agents.jobs

    def _handle(self, entry: object) -> None:
        now = self.now
        match entry:
            case SimJob():
                self.agents.arrive(entry)
                self.feed(JobArrived(now, JobId(entry.job_id), entry.spec))
            case Completion() | StopEnd() | EndTask():
                self.agents.handle(entry)
            case _Timer(kind="snapshot"):
                self.feed(usage_snapshot(self.usage, now, self.config.lookback_window_s))
                self._again(entry, self.settings.snapshot_s)
            case _Timer(kind="tick"):
                self.feed(Tick(now))
                self._again(entry, self.settings.tick_s)
            case _Timer(kind="sample"):
                self._sample()
                if now + self.settings.sample_s <= self.end + 1e-9:
                    self.world.at((now + self.settings.sample_s) * 1000, entry)
            case _Timer(kind=mark):  # the window opens or closes
                self.marks[mark] = self.usage.snapshot(now)
            case _:  # pragma: no cover - every entry pushed here is handled above
                raise SimulationError(f"unknown event {entry}")

    def _again(self, entry: _Timer, period_s: float) -> None:
        """Periodic inputs go on while anything is left to do."""
        busy = self.now < self.end or len(self.world.done) < len(self.arrivals)
        if busy or any(j.state not in OVER for j in self.jobs.values()):
            self.world.at((self.now + period_s) * 1000, entry)

    # -- what the scheduler hears --------------------------------------------------------

    def feed(self, event: Input) -> None:
        """Every input, charged as the projector charges the task lifecycle, then the
        scheduler's; the serving GPUs it holds after."""
        self.inputs += 1
        self.world.charge(self.usage, event)
        if isinstance(event, TaskStarted):
            task = self.world.tasks[event.task_id]
            gpus = 1 if task.serving else len(task.gpus)
            self.running[event.task_id] = (task.spec.allocation, gpus, event.at)
        elif isinstance(event, TaskEnded):
            allocation, gpus, began = self.running.pop(event.task_id)
            if event.job_id not in self.arrived:  # batch work (not a workflow's)
                used = gpus * (event.at - began)
                self.gpu_s_run[allocation] = self.gpu_s_run.get(allocation, 0.0) + used
            else:
                inside = min(event.at, self.end) - max(began, self.start)
                self.serving_run_s += max(inside, 0.0)
        super().feed(event)
        held = self.scheduler.serving_gpus()
        self.peak_held = max(self.peak_held, held)
        self.serving_steps.set(self.now, held)
        kept, other = self.scheduler.free_gpus()
        self.kept_steps.set(self.now, kept)
        self.other_steps.set(self.now, other)
        self.stalled_steps.set(self.now, int(self.scheduler.serving_stalled()))

    def held(self, spec: JobSpec, gpus: int) -> None:
        self.batch_by_class[spec.work_class.value] += gpus
        self.batch_steps.set(self.now, sum(self.batch_by_class.values()))

    def preempted(self, spec: JobSpec) -> None:
        self.preemptions += 1

    def _decided(self, decision: Decision) -> None:
        match decision:
            case Cancel(job_id=job_id):  # pragma: no cover - nothing is cancelled here
                raise SimulationError(f"{job_id} cancelled: nothing asked for that")
            case Wait(job_id=job_id) if job_id in self.arrived:
                self.waited.add(job_id)
            case ServingHeld() | ServingReleased():
                self.world.charge_serving(self.usage, decision)
            case Planned() | Wait():
                pass
            case _:
                self.agents.decide(decision)

    # -- measuring ---------------------------------------------------------------------------

    def _sample(self) -> None:
        active = sum(1 for w in self.world.workers.values() if w.running is not None or w.queue)
        self.peak_active = max(self.peak_active, active)
        self.samples.append(
            Sample(
                self.now - self.start,
                self.scheduler.serving_gpus(),
                active,
                tuple(self.batch_by_class[c] for c in CLASSES),
            )
        )

    # -- the numbers -----------------------------------------------------------------------

    def _result(self) -> MixedRun:
        s = self.settings
        b0, b1 = (self.start + t for t in s.burst_s)
        windows = {
            "all": [(self.start, self.end)],
            "burst": [(max(b0, self.start), min(b1, self.end))],
            "calm": [(self.start, min(b0, self.end)), (max(b1, self.start), self.end)],
        }

        def length(phase: str) -> float:
            return sum(max(b - a, 0.0) for a, b in windows[phase])

        serving_held = {p: self.serving_steps.over(windows[p]) for p in PHASES}
        spans = self.serving_steps.weights(windows["all"])
        at_cap = sum(w for v, w in spans.items() if v >= self.cap)
        batch_held = {p: self.batch_steps.over(windows[p]) for p in PHASES}
        window = length("all")
        busy = self._serving_busy(windows)
        batch_mean = batch_held["all"].mean
        charges, gpu_s_charged = self._charges(serving_held["all"].mean * window / 3600)
        return MixedRun(
            cache_model=CacheModel(self.config.serving_cache_model),
            serving_max_fraction=self.config.serving_max_fraction,
            serving_linger_s=self.config.serving_linger_s,
            serving_lend_s=self.config.serving_lend_s,
            serving_reserve=self.config.serving_reserve,
            serving_reserve_min=self.config.serving_reserve_min,
            serving_load_window_s=self.config.serving_load_window_s,
            capacity=self.capacity,
            serving_cap=self.cap,
            window_s=window,
            burst_s=s.burst_s,
            serving_held=serving_held,
            at_cap_pct=100 * at_cap / max(sum(spans.values()), 1e-9),
            serving_busy={p: busy[p] / max(length(p), 1e-9) for p in PHASES},
            batch_held=batch_held,
            free_kept={p: self.kept_steps.over(windows[p]) for p in PHASES},
            free_other={p: self.other_steps.over(windows[p]) for p in PHASES},
            batch_occupancy_pct=100 * batch_mean / self.capacity,
            cluster_occupancy_pct=100 * (batch_mean + serving_held["all"].mean) / self.capacity,
            busy_occupancy_pct=100 * (batch_mean + busy["all"] / window) / self.capacity,
            batch_waits=self._waits(),
            workflows=self._slowdowns(),
            charges=charges,
            cache_hit_rate=hit_rate(hits(self.world.served)),
            batch_evictions=self.world.evicted_by_batch,
            preemptions=self.preemptions,
            jobs=sum(1 for j in self.batch if self.start <= j.at < self.end),
            workflow_jobs=len(self.arrivals),
            stalled_s=self.stalled_steps.weights(windows["all"]).get(1, 0.0),
            longest_stall_s=self.stalled_steps.longest(1, windows["all"][0]),
            peak_serving_held=self.peak_held,
            peak_serving_active=self.peak_active,
            gpu_s_run=dict(sorted(self.gpu_s_run.items())),
            gpu_s_held=sum(v * w for v, w in self.serving_steps.weights([(0.0, self.now)]).items()),
            gpu_s_charged=gpu_s_charged,
            decisions=self.decisions,
            inputs=self.inputs,
            series=tuple(self.samples),
        )

    def _serving_busy(self, windows: Mapping[str, list[tuple[float, float]]]) -> dict[str, float]:
        """GPU-seconds running workflow tasks, by phase (each task split at the edges)."""
        busy = dict.fromkeys(PHASES, 0.0)
        for job_id, (_, flow) in self.arrived.items():
            for task in flow.tasks:
                end_ms = self.world.ended.get(f"{job_id}/{task.task_id}")
                if end_ms is None:  # pragma: no cover - every task ends
                    continue
                a, b = (end_ms - task.run_ms) / 1000, end_ms / 1000
                for phase, parts in windows.items():
                    busy[phase] += sum(max(min(b, hi) - max(a, lo), 0.0) for lo, hi in parts)
        return busy

    def _charges(self, held_h: float) -> tuple[tuple[Charge, ...], dict[str, float]]:
        """GPU-hours charged in the window; ``held_h``: the serving GPUs held then."""
        first, last = self.marks["start"], self.marks["end"]
        entitlements = self.tree.entitlements()
        serving_h = self.serving_run_s / 3600
        charges = []
        for name, share in entitlements.items():
            a, b = first.get(name, Usage()), last.get(name, Usage())
            charges.append(
                Charge(
                    name,
                    share,
                    (b.allocated_gpu_s - a.allocated_gpu_s) / 3600,
                    (b.unallocated_gpu_s - a.unallocated_gpu_s) / 3600,
                    held_h if name == SERVING_TEAM else 0.0,
                    serving_h if name == SERVING_TEAM else 0.0,
                )
            )
        final = self.usage.snapshot(self.now)
        total = {n: u.allocated_gpu_s + u.unallocated_gpu_s for n, u in final.items()}
        return tuple(charges), total

    def _waits(self) -> dict[tuple[str, str], Distribution]:
        """Batch queue waits (s) of the jobs submitted in the window, up to its end."""
        groups: dict[tuple[str, str], list[float]] = {}
        for job in self.jobs.values():
            sim = job.sim
            if not self.start <= sim.at < self.end:
                continue
            began = job.first_start if job.first_start is not None else math.inf
            wait = min(began, self.end) - sim.at
            team, cls = sim.spec.allocation, sim.spec.work_class.value
            for key in ((team, cls), (team, "all"), ("all", cls), ("all", "all")):
                groups.setdefault(key, []).append(wait)
        return {k: Distribution.of(v) for k, v in sorted(groups.items())}

    def _slowdowns(self) -> dict[str, Slowdowns]:
        by_phase: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
        waited: dict[str, int] = dict.fromkeys(PHASES, 0)
        for job_id, (arrived_ms, flow) in self.arrived.items():
            latency = self.world.done[job_id] - arrived_ms
            entry = (workflow_slowdown(latency, self.best_case_ms[flow.name]), latency)
            phase = self.settings.phase(arrived_ms / 1000 - self.start)
            for p in ("all", phase):
                by_phase[p].append(entry)
                waited[p] += job_id in self.waited
        out = {}
        for phase, entries in by_phase.items():
            slow = Distribution.of([s for s, _ in entries])
            latencies = Distribution.of([ms for _, ms in entries])
            out[phase] = Slowdowns(slow.count, slow.p50, slow.p99, latencies.p50, waited[phase])
        return out


def simulate_mixed(
    profiles: Profiles,
    config: PolicyConfig,
    settings: MixedSettings | None = None,
    *,
    workflows: bool = True,
) -> MixedRun:
    """One run; without ``workflows``, the same batch jobs alone (the baseline that shows
    what serving costs batch work)."""
    chosen = settings or MixedSettings()
    return MixedCluster(profiles, config, chosen, workflows=workflows).simulate()


def mixed_policy(
    profiles: Profiles, fraction: float, knobs: Mapping[str, Any] | None = None
) -> PolicyConfig:
    """The policy of a mixed run: ``serving_policy`` with the ``knobs`` and this
    ``serving_max_fraction``."""
    return serving_policy(profiles.costs, **{**(knobs or {}), "serving_max_fraction": fraction})


@dataclass(frozen=True)
class Run:
    """One mixed run to make: its policy and workload, with workflows or without."""

    config: PolicyConfig
    settings: MixedSettings
    workflows: bool = True


def run_all(
    profiles: Profiles,
    runs: Sequence[Run],
    *,
    parallel: bool = False,
    on_run: Callable[[MixedRun], None] | None = None,
) -> list[MixedRun]:
    """Each run's result, in order; ``parallel``: in a process per core (the results are
    the same). ``on_run`` is told of each as it ends."""
    told = on_run or (lambda _: None)
    if not parallel or len(runs) < 2:
        done = []
        for run in runs:
            done.append(_simulate(profiles, run))
            told(done[-1])
        return done
    from concurrent.futures import ProcessPoolExecutor, as_completed

    cores = len(os.sched_getaffinity(0))  # those this process may use, as the sweeps count
    with ProcessPoolExecutor(max_workers=min(len(runs), cores)) as pool:
        futures = [pool.submit(_simulate, profiles, run) for run in runs]
        for future in as_completed(futures):
            told(future.result())
        return [f.result() for f in futures]


def _simulate(profiles: Profiles, run: Run) -> MixedRun:
    return simulate_mixed(profiles, run.config, run.settings, workflows=run.workflows)


def run_seeds(
    profiles: Profiles,
    fractions: Sequence[float],
    settings: MixedSettings,
    seeds: Sequence[int],
    *,
    knobs: Mapping[str, Any] | None = None,
    parallel: bool = False,
    on_run: Callable[[MixedRun], None] | None = None,
) -> list[SeedRuns]:
    """For each seed, the same workload under each ``serving_max_fraction`` (in that
    order, with the policy ``knobs``: ``serving_policy``'s) and its batch jobs alone
    (``fractions[0]``'s policy): the baseline for what serving costs, and the same policy
    judged on workloads it was not tuned on. ``parallel`` and ``on_run`` as ``run_all``."""
    configs = [mixed_policy(profiles, f, knobs) for f in fractions]
    runs = []
    for seed in seeds:
        seeded = dataclasses.replace(settings, seed=seed)
        runs += [Run(config, seeded) for config in configs]
        runs.append(Run(configs[0], seeded, workflows=False))
    done = iter(run_all(profiles, runs, parallel=parallel, on_run=on_run))
    return [
        SeedRuns(seed, tuple(itertools.islice(done, len(configs))), next(done)) for seed in seeds
    ]
