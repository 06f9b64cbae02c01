"""Workflow serving simulation: the four Compass workflows on a cluster of GPUs.

Jobs (one workflow each, drawn in equal shares) arrive by a Poisson or a
bursty gamma process. Each job is planned on arrival by the chosen mode
(libs.core.compass); a GPU runs the earliest-queued task whose inputs have
arrived, loading its model first when it is not resident (evicting with
look-ahead). ``compass`` re-places a successor when its planned GPU is backed
up; ``jit`` re-routes every task when it becomes ready. Deterministic: a
seeded generator, and ties broken by sequence.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from libs.core.compass import Costs, GpuState, PlanMode, Planner, Workflow, evict_for

RESCHEDULE_THRESHOLD = 1.5


@dataclass(frozen=True)
class WorkflowRun:
    mode: PlanMode
    gpus: int
    jobs: int
    median_slowdown: float
    p99_slowdown: float
    median_latency_ms: float
    cache_hit_rate: float
    gpus_used: int
    per_workflow: dict[str, tuple[float, float]]  # name -> (median slowdown, cache hit rate)
    breakdown_ms: dict[str, float]  # mean per task: queue, load, transfer, run


@dataclass
class _Task:
    job: int
    task_id: str
    gpu: int
    ready_at: float = -1.0  # inputs arrived; -1 while a parent runs
    waiting_parents: int = 0
    finish: float = 0.0
    seq: int = 0


@dataclass
class _Gpu:
    index: int
    busy_until: float = 0.0
    resident: dict[str, float] = field(default_factory=dict)
    queue: list[_Task] = field(default_factory=list)
    used: bool = False


def simulate(
    workflows: Sequence[Workflow],
    best_case_ms: Mapping[str, float],
    costs: Costs,
    *,
    mode: PlanMode,
    gpus: int,
    jobs: int = 1000,
    rate_per_s: float = 40.0,
    burst_shape: float = 0.0,  # 0: Poisson; else gamma inter-arrivals with this shape
    seed: int = 7,
    warmup: float = 0.1,
) -> WorkflowRun:
    rng = random.Random(seed)
    planner = Planner(costs, mode)
    cluster = [_Gpu(i) for i in range(gpus)]
    events: list[tuple[float, int, str, int, str]] = []  # (time, seq, kind, job, task)
    seq = 0

    def push(at: float, kind: str, job: int, task: str = "") -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, job, task))

    now = 0.0
    mean_gap = 1000.0 / rate_per_s
    for job in range(jobs):
        push(now, "arrive", job)
        gap = (
            rng.gammavariate(burst_shape, mean_gap / burst_shape)
            if burst_shape
            else rng.expovariate(1 / mean_gap)
        )
        now += gap
    flows: dict[int, Workflow] = {}
    tasks: dict[tuple[int, str], _Task] = {}
    arrived: dict[int, float] = {}
    finished: dict[int, float] = {}
    left: dict[int, int] = {}
    hits = misses = 0
    per_flow_hits: dict[str, list[int]] = {}
    totals = {"queue": 0.0, "load": 0.0, "transfer": 0.0, "run": 0.0}
    counted = 0

    def view() -> list[GpuState]:
        return [
            GpuState(
                f"g{g.index:04d}", f"n{g.index:04d}", max(g.busy_until, clock), dict(g.resident)
            )
            for g in cluster
        ]

    def backlog(g: _Gpu) -> float:
        flow_of = flows
        queued = sum(flow_of[t.job].task(t.task_id).run_ms for t in g.queue)
        return max(g.busy_until, clock) + queued

    def try_start(g: _Gpu) -> None:
        nonlocal hits, misses, counted
        if g.busy_until > clock:
            return
        ready = [t for t in g.queue if 0 <= t.ready_at <= clock]
        if not ready:
            return
        task_state = min(ready, key=lambda t: t.seq)
        g.queue.remove(task_state)
        flow = flows[task_state.job]
        task = flow.task(task_state.task_id)
        load = 0.0
        if task.model:
            key = f"{flow.name}/{task.model}"  # as the source simulator keys its cache
            hit = key in g.resident
            per_flow_hits.setdefault(flow.name, [0, 0])[0 if hit else 1] += 1
            if hit:
                hits += 1
            else:
                misses += 1
                upcoming = {
                    f"{flows[t.job].name}/{flows[t.job].task(t.task_id).model}": float(t.seq)
                    for t in reversed(g.queue)
                    if flows[t.job].task(t.task_id).model
                }
                victims = evict_for(task.model_mb, costs.gpu_memory_mb, g.resident, upcoming)
                for victim in victims or ():
                    del g.resident[victim]
                g.resident[key] = task.model_mb
                load = costs.load_ms(task.model_mb)
        start = clock + load
        g.busy_until = start + task.run_ms
        g.used = True
        task_state.finish = g.busy_until
        totals["queue"] += clock - task_state.ready_at
        totals["load"] += load
        totals["run"] += task.run_ms
        counted += 1
        push(g.busy_until, "finish", task_state.job, task_state.task_id)

    clock = 0.0
    while events:
        clock, _, kind, job, task_id = heapq.heappop(events)
        if kind == "arrive":
            flow = workflows[rng.randrange(len(workflows))]
            flows[job] = flow
            arrived[job] = clock
            left[job] = len(flow.tasks)
            plan = planner.plan(flow, view(), clock, job_id=str(job))
            for assignment, task in zip(plan, flow.tasks, strict=True):
                state = _Task(job, task.task_id, int(assignment.gpu_id[1:]))
                state.waiting_parents = len(task.parents)
                seq += 1
                state.seq = seq
                if not task.parents:
                    state.ready_at = clock
                tasks[(job, task.task_id)] = state
                cluster[state.gpu].queue.append(state)
            for g in cluster:
                try_start(g)
        elif kind == "finish":
            flow = flows[job]
            done = tasks[(job, task_id)]
            left[job] -= 1
            if left[job] == 0:
                finished[job] = clock
            for child_id in flow.children(task_id):
                child = tasks[(job, child_id)]
                child.waiting_parents -= 1
                if child.waiting_parents:
                    continue
                child_task = flow.task(child_id)
                if mode in (PlanMode.COMPASS, PlanMode.JIT):
                    planned = cluster[child.gpu]
                    threshold = RESCHEDULE_THRESHOLD if mode is PlanMode.COMPASS else 0.0
                    states = view()
                    for view_of, g in zip(states, cluster, strict=True):
                        view_of.free_at_ms = backlog(g)
                    chosen = planner.adjust(
                        child_task, states[planned.index], states, clock, threshold
                    )
                    new = int(chosen.gpu_id[1:])
                    if new != child.gpu:
                        planned.queue.remove(child)
                        cluster[new].queue.append(child)
                        child.gpu = new
                parents_done = max(tasks[(job, p)].finish for p in child_task.parents)
                transfer = max(
                    costs.transfer_ms(child_task.in_kb, tasks[(job, p)].gpu == child.gpu)
                    for p in child_task.parents
                )
                totals["transfer"] += transfer
                child.ready_at = parents_done + transfer
                push(child.ready_at, "ready", job, child_id)
            try_start(cluster[done.gpu])
        else:  # a task's inputs arrived
            try_start(cluster[tasks[(job, task_id)].gpu])
        if kind != "arrive":
            for g in cluster:
                if g.busy_until <= clock and g.queue:
                    try_start(g)
    measured = sorted(finished)[int(len(finished) * warmup) :]
    slowdowns = [(finished[j] - arrived[j]) / best_case_ms[flows[j].name] for j in measured]
    latencies = [finished[j] - arrived[j] for j in measured]
    per_workflow = {}
    for flow in workflows:
        mine = [s for j, s in zip(measured, slowdowns, strict=True) if flows[j].name == flow.name]
        h, m = per_flow_hits.get(flow.name, [0, 0])
        per_workflow[flow.name] = (
            statistics.median(mine) if mine else 0.0,
            h / (h + m) if h + m else 0.0,
        )
    return WorkflowRun(
        mode=mode,
        gpus=gpus,
        jobs=len(measured),
        median_slowdown=statistics.median(slowdowns),
        p99_slowdown=sorted(slowdowns)[int(0.99 * (len(slowdowns) - 1))],
        median_latency_ms=statistics.median(latencies),
        cache_hit_rate=hits / (hits + misses) if hits + misses else 0.0,
        gpus_used=sum(g.used for g in cluster),
        per_workflow=per_workflow,
        breakdown_ms={k: v / max(counted, 1) for k, v in totals.items()},
    )
