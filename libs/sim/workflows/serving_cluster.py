"""The serving cluster: the planners (``Scheduler``s, their serving core) over the
simulated cluster (``libs.sim.world``), and one run of workflows through it
(``simulate``): arrivals, the planners' decisions, each task's queue, load, transfer
and run, and the figures a run yields (``WorkflowRun``).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.core.compass import (
    CacheModel,
    Costs,
    PlanMode,
    Workflow,
)
from libs.core.compass.serving import MB_PER_GIB
from libs.core.config import PolicyConfig
from libs.core.decisions import Decision, Place, Planned, ServingHeld, ServingReleased, Wait
from libs.core.ids import JobId, NodeId, workflow_task_id
from libs.core.inputs import (
    Input,
    JobArrived,
    NodeJoined,
    PeerArrived,
    PeerPlaced,
    PeerPlanned,
    PeerTask,
)
from libs.core.model import JobSpec, NodeSpec
from libs.core.scheduler import Scheduler
from libs.core.service_level import workflow_slowdown
from libs.sim.workflows.profiles import Profiles, keyed
from libs.sim.world import Served, SimulationError, World

PARTS = ("queue", "load", "transfer", "run")


GPU_TYPE = "T4"


ALLOCATION = "serving"


PROGRESS_EVERY = 1_000  # agenda entries between two progress reports of a run


@dataclass(frozen=True)
class WorkflowRun:
    mode: PlanMode
    gpus: int
    jobs: int  # measured (after the warm-up)
    median_slowdown: float
    p99_slowdown: float
    median_latency_ms: float
    p99_latency_ms: float
    cache_hit_rate: float
    gpus_used: int  # GPUs that ran at least one task
    per_workflow: dict[str, tuple[float, float]]  # name -> (median slowdown, cache hit rate)
    breakdown_ms: dict[str, float]  # mean per task: queue, load, transfer, run
    # mean per workflow: from arrival to its plan (compass holds workflows back
    # under overload; the GPU queue column then no longer holds all the waiting)
    held_ms: float
    # (workflow, task) -> mean queue, load, transfer, run (ms)
    task_breakdown_ms: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    adjusted: int = 0  # tasks sent elsewhere than planned (or than a GPU that refused them)
    refused: int = 0  # sends a GPU refused: it would have kept the task waiting too long
    decisions: int = 0  # decisions the core made
    cache_model: CacheModel = CacheModel.LOOKAHEAD  # the workers', as the planner knew it
    staleness_ms: float = 0.0  # how late the workers' reports reached the scheduler
    planners: int = 1  # how many planners split the arrivals


def arrivals(jobs: int, rate_per_s: float, burst_shape: float, rng: random.Random) -> list[float]:
    """Arrival times (ms): Poisson, or gamma inter-arrivals of shape ``burst_shape``
    (below 1 is bursty: the coefficient of variation is 1/sqrt(shape)); same mean rate."""
    mean_gap = 1000.0 / rate_per_s
    times, now = [], 0.0
    for _ in range(jobs):
        times.append(now)
        now += (
            rng.gammavariate(burst_shape, mean_gap / burst_shape)
            if burst_shape
            else rng.expovariate(1 / mean_gap)
        )
    return times


@dataclass(frozen=True)
class ToPeers:
    """What the other planners read off the log of one planner's work: its ``Place``s
    and ``Planned``s, and the workflows handed to it."""

    sender: int  # the planner that decided it, or was handed it
    event: PeerPlaced | PeerPlanned | PeerArrived


class ServingCluster:
    """The planners and the simulated cluster (``libs.sim.world``), serving.

    ``feed`` hands one input to the planners (``Scheduler``s) and acts on what they
    decide: a serving ``Place`` goes to its GPU's queue; the GPUs' reports are fed
    back, and at their times by ``run``, which drains the agenda. The mixed
    simulation drives it too, with one planner and batch work on the side
    (``on_decision`` sees every decision that is not a serving ``Place``).

    Several planners split the workflows that arrive, in turn, and share only what
    a planner reads off the log: every worker report, each other's plans
    (``PeerPlanned``) and serving ``Place``s (``PeerPlaced``), and the workflows
    handed to the others (``PeerArrived``), all ``staleness_ms`` late.
    """

    def __init__(
        self,
        planners: Sequence[Scheduler],
        costs: Costs,
        on_decision: Callable[[Decision], None] | None = None,
        stop_grace_s: float = 30.0,  # for batch work on the side
        staleness_ms: float = 0.0,
    ) -> None:
        if not planners:
            raise SimulationError("a serving cluster needs a planner")
        self.planners = tuple(planners)
        self.scheduler = self.planners[0]  # the one that plans batch work, if any
        self.on_decision = on_decision
        self.staleness_ms = staleness_ms
        self.world = World(
            per_s=1000.0,
            stop_grace_s=stop_grace_s,
            host_to_gpu_mb_per_ms=costs.host_to_gpu_mb_per_ms,
            # The workers' caches are what the planner counts on (a policy knob).
            cache_model=CacheModel(self.scheduler.config.serving_cache_model),
            deliver=self.report,
        )
        self.decisions = 0
        self.adjusted = 0  # tasks sent elsewhere than planned
        self.arrived: dict[str, tuple[float, Workflow]] = {}  # workflow job -> (ms, workflow)
        self.planned_by = [0] * len(self.planners)  # workflows each planner was handed
        self.planned_ms: dict[str, float] = {}  # workflow job -> when its plan was made

    def add_gpu_node(self, node_id: str, gpu_indices: tuple[int, ...], memory_mb: float) -> None:
        gib = memory_mb / MB_PER_GIB  # the serving core reads memory in GiB
        node = NodeSpec(NodeId(node_id), GPU_TYPE, gpu_indices, gib)
        self.feed(NodeJoined(self.world.now_s, node))
        self.world.join(node)

    def run(
        self,
        handle: Callable[[object], None] | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        """Process the agenda in time order; ``handle`` takes what neither the world nor
        the scheduler does; ``on_progress`` hears how many workflows have finished, now
        and then."""
        world = self.world
        steps = 0
        while world:
            steps += 1
            if on_progress is not None and not steps % PROGRESS_EVERY:
                on_progress(len(world.done))
            entry = world.pop()
            if world.handle(entry):
                continue
            if isinstance(entry, Input):
                self.feed(entry)
            elif isinstance(entry, ToPeers):
                self._decide(
                    entry.event, [i for i in range(len(self.planners)) if i != entry.sender]
                )
            elif handle is not None:
                handle(entry)
            else:  # pragma: no cover - every entry pushed here is handled above
                raise SimulationError(f"unknown event {entry}")
        if unfinished := len(self.arrived) - len(world.done):
            raise SimulationError(f"{unfinished} of {len(self.arrived)} workflows never finished")

    def report(self, event: Input) -> None:
        """A worker's report (a load, an eviction, a start, an end) reaches the planners
        ``staleness_ms`` after it happened: what they know of the GPUs is that old, and a
        task's successors are sent that much later. Among several planners it goes by
        the agenda even when on time, so that it comes after the ``PeerPlaced`` of its
        task, as on the log."""
        if self.staleness_ms or len(self.planners) > 1:
            self.world.at(self.world.now + self.staleness_ms, event)
        else:
            self.feed(event)

    def feed(self, event: Input) -> None:
        """A workflow goes to one planner, the next in turn (the others read of it late);
        every other input to all."""
        indices = range(len(self.planners))
        if isinstance(event, JobArrived) and event.spec.workflow is not None:
            turn = len(self.arrived) % len(self.planners)
            self.arrived[event.job_id] = (self.world.now, event.spec.workflow)
            self.planned_by[turn] += 1
            indices = range(turn, turn + 1)
            if len(self.planners) > 1:
                work = event.spec.workflow.work_ms
                peer = PeerArrived(event.at, event.job_id, event.spec.gpu_type, work)
                self.world.at(self.world.now + self.staleness_ms, ToPeers(turn, peer))
        self._decide(event, indices)

    def _decide(self, event: Input, indices: Iterable[int]) -> None:
        for i in indices:
            for decision in self.planners[i].handle(event):
                self.decisions += 1
                self._act(decision, i)

    def _share_plan(self, decision: Planned, by: int) -> None:
        """The others read the plan off the log, late: with the workflow (its
        submission is on the log too) it says what each task will take where."""
        workflow = self.arrived[decision.job_id][1]
        tasks = []
        for planned in decision.tasks:
            task = workflow.task(planned.name)
            tasks.append(
                PeerTask(
                    workflow_task_id(decision.job_id, planned.name),
                    planned.node_id,
                    planned.gpu_index,
                    task.model,
                    task.model_mb,
                    task.run_ms,
                    # heft's start leaves the load out: none is taken before the plan
                    max(planned.start_ms - planned.load_ms, self.world.now),
                )
            )
        peer = PeerPlanned(self.world.now / 1000, decision.job_id, tuple(tasks))
        self.world.at(self.world.now + self.staleness_ms, ToPeers(by, peer))

    def _act(self, decision: Decision, by: int = 0) -> None:
        if isinstance(decision, Planned):
            self.planned_ms[decision.job_id] = self.world.now
            if len(self.planners) > 1:
                self._share_plan(decision, by)
        serving = decision.serving if isinstance(decision, Place) else None
        if serving is None:
            if self.on_decision is not None:
                self.on_decision(decision)
            elif not isinstance(decision, Planned | Wait | ServingHeld | ServingReleased):
                raise SimulationError(f"unexpected decision {decision}")
            return
        assert isinstance(decision, Place)
        if serving.planned is not None:
            self.adjusted += 1
        if len(self.planners) > 1:  # the others read it off the log, late
            now = self.world.now
            task = PeerTask(
                decision.task_id,
                decision.node_id,
                decision.gpu_indices[0],
                serving.model,
                serving.model_mb,
                serving.run_ms,
                now + serving.input_delay_ms,
            )
            peer = PeerPlaced(now / 1000, decision.job_id, task)
            self.world.at(now + self.staleness_ms, ToPeers(by, peer))
        self.world.send(decision)


def hits(served: Sequence[Served]) -> dict[str, list[int]]:
    """Workflow -> [cache hits, misses] of its tasks that name a model."""
    counts: dict[str, list[int]] = {}
    for s in served:
        if s.begun.serving.model:
            counts.setdefault(_flow(s), [0, 0])[0 if s.begun.hit else 1] += 1
    return counts


def hit_rate(counts: Mapping[str, Sequence[int]]) -> float:
    """Cache hits over the model lookups ``hits`` counted."""
    hit = sum(h for h, _ in counts.values())
    looked = sum(h + m for h, m in counts.values())
    return hit / looked if looked else 0.0


def _flow(served: Served) -> str:
    workflow = served.task.spec.workflow
    return workflow.name if workflow else ""


def _parts(served: Sequence[Served]) -> dict[tuple[str, str], list[float]]:
    """(workflow, task) -> summed queue, load, transfer and run ms, and a count."""
    parts: dict[tuple[str, str], list[float]] = {}
    for s in served:
        p = parts.setdefault((_flow(s), s.name), [0.0] * 5)
        p[0] += s.taken_ms - s.begun.ready_ms
        p[1] += s.begun.load_ms
        p[2] += s.transfer_ms
        p[3] += s.begun.serving.run_ms
        p[4] += 1
    return parts


def serving_policy(costs: Costs, **knobs: Any) -> PolicyConfig:
    """The default policy with the profiles' transfer rates, and ``knobs``."""
    return dataclasses.replace(
        PolicyConfig(),
        host_to_gpu_mb_per_ms=costs.host_to_gpu_mb_per_ms,
        node_to_node_mb_per_ms=costs.node_to_node_mb_per_ms,
        **knobs,
    )


def policy(mode: PlanMode, costs: Costs, **knobs: Any) -> PolicyConfig:
    """The serving policy of the sweep: every GPU may serve."""
    return serving_policy(
        costs, **{"serving_mode": mode.value, "serving_max_fraction": 1.0, **knobs}
    )


def simulate(
    profiles: Profiles,
    *,
    mode: PlanMode,
    gpus: int,
    jobs: int = 1000,
    rate_per_s: float = 40.0,
    burst_shape: float = 0.0,  # 0: Poisson; else gamma inter-arrivals with this shape
    seed: int = 7,
    warmup: float = 0.1,
    share_models: bool = False,
    hold_threshold: float = PolicyConfig.hold_threshold,
    due_slack: float = PolicyConfig.due_slack,
    admit_load: float = PolicyConfig.admit_load,
    arrival_window_s: float = PolicyConfig.arrival_window_s,
    admit_window_s: float = PolicyConfig.admit_window_s,
    cache_model: CacheModel = CacheModel.LOOKAHEAD,
    staleness_ms: float = 0.0,  # how late the workers' reports reach the scheduler
    planners: int = 1,  # planners splitting the arrivals, sharing only what is reported
    on_progress: Callable[[float], None] | None = None,
) -> WorkflowRun:
    """One run; ``on_progress`` hears the share of its workflows finished, now and then."""
    rng = random.Random(seed)
    flows = list(profiles.workflows) if share_models else [keyed(w) for w in profiles.workflows]
    config = policy(
        mode,
        profiles.costs,
        hold_threshold=hold_threshold,
        due_slack=due_slack,
        admit_load=admit_load,
        arrival_window_s=arrival_window_s,
        admit_window_s=admit_window_s,
        serving_cache_model=cache_model.value,
    )
    # Several planners each take GPUs that tie in an order of their own (order.py).
    configs = [config]
    if planners > 1:
        configs = [dataclasses.replace(config, serving_planner=f"p{i}") for i in range(planners)]
    cluster = ServingCluster(
        [Scheduler(c) for c in configs],
        profiles.costs,
        staleness_ms=staleness_ms,
    )
    for i in range(gpus):
        cluster.add_gpu_node(f"n{i:04d}", (0,), profiles.costs.gpu_memory_mb)
    for n, at in enumerate(arrivals(jobs, rate_per_s, burst_shape, rng)):
        spec = JobSpec(ALLOCATION, "sim", 1, (), workflow=flows[rng.randrange(len(flows))])
        cluster.world.at(at, JobArrived(at / 1000, JobId(f"w{n:06d}"), spec))
    cluster.run(on_progress=None if on_progress is None else lambda done: on_progress(done / jobs))
    served, arrived, finished = cluster.world.served, cluster.arrived, cluster.world.done
    counts, parts = hits(served), _parts(served)
    done = sorted(finished, key=lambda j: (finished[j], j))
    measured = done[int(len(done) * warmup) :]
    slowdowns = [
        workflow_slowdown(finished[j] - arrived[j][0], profiles.best_case_ms[arrived[j][1].name])
        for j in measured
    ]
    latencies = sorted(finished[j] - arrived[j][0] for j in measured)
    per_workflow = {}
    for flow in flows:
        mine = [
            s for j, s in zip(measured, slowdowns, strict=True) if arrived[j][1].name == flow.name
        ]
        h, m = counts.get(flow.name, [0, 0])
        per_workflow[flow.name] = (
            statistics.median(mine) if mine else 0.0,
            h / (h + m) if h + m else 0.0,
        )
    counted = sum(p[4] for p in parts.values())
    return WorkflowRun(
        mode=mode,
        gpus=gpus,
        jobs=len(measured),
        median_slowdown=statistics.median(slowdowns),
        p99_slowdown=_p99(sorted(slowdowns)),
        median_latency_ms=statistics.median(latencies),
        p99_latency_ms=_p99(latencies),
        cache_hit_rate=hit_rate(counts),
        gpus_used=len({(s.task.node_id, s.task.gpus[0]) for s in served}),
        per_workflow=per_workflow,
        breakdown_ms={
            part: sum(p[i] for p in parts.values()) / max(counted, 1)
            for i, part in enumerate(PARTS)
        },
        held_ms=statistics.fmean(cluster.planned_ms[j] - arrived[j][0] for j in measured),
        task_breakdown_ms={
            key: {part: p[i] / max(p[4], 1) for i, part in enumerate(PARTS)}
            for key, p in sorted(parts.items())
        },
        adjusted=cluster.adjusted,
        refused=cluster.world.refused,
        decisions=cluster.decisions,
        cache_model=cache_model,
        staleness_ms=staleness_ms,
        planners=planners,
    )


def _p99(ordered: Sequence[float]) -> float:
    return ordered[int(0.99 * (len(ordered) - 1))]
