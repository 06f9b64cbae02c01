"""A GPU's timeline: its shortcuts (gaps only, edits in place) agree with doing it all."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core.compass import CacheModel, Costs, GpuState, PlanMode, Planner, Task, build_workflow
from libs.core.compass.cache import load_ms
from libs.core.compass.choice import Shortlist
from libs.core.compass.order import GpuOrder
from libs.core.compass.timeline import Pending, Timeline

Weigh = Callable[[str, float], float]

COSTS = Costs(host_to_gpu_mb_per_ms=10.0, node_to_node_mb_per_ms=10.0, gpu_memory_mb=10_000)
# Each property holds under either cache model: the planner's picture follows it.
costs = st.sampled_from([dataclasses.replace(COSTS, cache_model=m) for m in CacheModel])
MODELS = {"": 0.0, "a": 4000.0, "b": 5000.0, "c": 3000.0}
NOW = 100.0

models = st.sampled_from(sorted(MODELS))
times = st.sampled_from([0.0, 50.0, NOW, 150.0, 400.0, 1000.0])
pendings = st.builds(
    lambda model, run, ready, sent: Pending(model, MODELS[model], run, ready, sent),
    models,
    st.sampled_from([1.0, 30.0, 200.0]),
    times,
    st.booleans(),
)
backlogs = st.lists(pendings, max_size=12)


def timeline(backlog: list[Pending], free_at: float = NOW, with_costs: Costs = COSTS) -> Timeline:
    gpu = GpuState("g0", "n0", free_at, {"a": 4000.0}, backlog=tuple(backlog))
    return Timeline(with_costs, gpu, NOW, reserve=True)


def played(line: Timeline) -> list[tuple[float, list[tuple[str, float]]]]:
    return [(line.end(k), list(line.cache(k).items())) for k in range(len(line) + 1)]


def fit_by_looking_everywhere(line: Timeline, task: Task, ready: float) -> int:
    """The first place from the task's turn where its load and run fit before the
    next task (the definition ``Timeline.fit`` shortcuts)."""
    for j in range(line.slot(ready), len(line)):
        need = task.run_ms + load_ms(line.costs, task, line.cache(j), line.memory_mb)
        if line.begin(j, ready) + need <= line.begin(j, line.keys[j][0]):
            return j
    return len(line)


@settings(max_examples=300, deadline=None)
@given(backlogs, models, st.sampled_from([1.0, 30.0, 200.0]), times, costs)
def test_fit_visits_gaps_only_and_finds_what_looking_everywhere_finds(
    backlog: list[Pending], model: str, run: float, ready: float, with_costs: Costs
) -> None:
    task = Task("t", model, MODELS[model], run, 1.0, 1.0)
    line = timeline(backlog, with_costs=with_costs)
    assert line.fit(task, ready, insertion=True) == fit_by_looking_everywhere(
        timeline(backlog, with_costs=with_costs), task, ready
    )


edits = st.lists(st.tuples(st.integers(0, 20), pendings, st.booleans()), max_size=6)


def edit(line: Timeline, current: list[Pending], at: int, item: Pending, look: bool) -> None:
    """A send (``item.sent``: a planned task, if any, leaves and the sent one joins) or
    a plan (the task goes where it fits); ``look`` first plays some of the timeline,
    so that the edit has something played after it to take up again."""
    item = dataclasses.replace(item)  # each task has an item of its own
    if look:
        line.end(min(at, len(line)))
    if item.sent:
        planned = [p for p in current if not p.sent]
        left = planned[at % len(planned)] if planned and at % 2 else None
        line.replace(None if left is None else line.find(left), item)
        current[:] = [p for p in current if p is not left] + [item]
    else:  # the planner plans nothing earlier than now
        item = dataclasses.replace(item, ready_ms=max(item.ready_ms, NOW))
        task = Task("t", item.model, item.model_mb, item.run_ms, 1.0, 1.0)
        line.insert(line.fit(task, item.ready_ms, insertion=True), item)
        current.append(item)


@settings(max_examples=300, deadline=None)
@given(backlogs, edits, st.booleans(), costs)
def test_what_was_played_past_an_edit_is_taken_up_only_where_it_still_holds(
    backlog: list[Pending], changes: list[tuple[int, Pending, bool]], sends: bool, with_costs: Costs
) -> None:
    # A plan inserts into its own timelines; serving edits its kept ones by sends.
    backlog = [dataclasses.replace(p) for p in backlog]
    looked = timeline(backlog, with_costs=with_costs)
    unlooked = timeline(backlog, with_costs=with_costs)
    current, twin = list(backlog), list(backlog)
    for at, item, look in changes:
        change = dataclasses.replace(item, sent=sends)
        edit(looked, current, at, change, look)
        edit(unlooked, twin, at, change, look=False)  # nothing played: plays it all anew
    assert [(p.model, p.run_ms, p.ready_ms) for p in looked.items] == [
        (p.model, p.run_ms, p.ready_ms) for p in unlooked.items
    ]
    assert played(looked) == played(unlooked)


@settings(max_examples=300, deadline=None)
@given(backlogs, edits, costs)
def test_sends_edit_a_timeline_into_the_one_the_gpu_now_has(
    backlog: list[Pending], changes: list[tuple[int, Pending, bool]], with_costs: Costs
) -> None:
    backlog = [dataclasses.replace(p) for p in backlog]
    line = timeline(backlog, with_costs=with_costs)
    current = list(backlog)
    for at, item, look in changes:
        edit(line, current, at, dataclasses.replace(item, sent=True), look)
    # A GPU's backlog: sent tasks in the order sent, then planned ones as planned.
    sent_first = [p for p in current if p.sent] + [p for p in current if not p.sent]
    fresh = timeline(sent_first, with_costs=with_costs)
    assert line.items == fresh.items
    assert played(line) == played(fresh)


@st.composite
def workflows(draw: st.DrawFn) -> list[Task]:
    tasks: list[Task] = []
    for i in range(draw(st.integers(1, 25))):
        model = draw(models)
        named = [t.task_id for t in tasks]
        parents = draw(st.lists(st.sampled_from(named), max_size=3)) if named else []
        run = draw(st.sampled_from([5.0, 40.0, 300.0]))
        kb = draw(st.sampled_from([1.0, 3000.0]))
        tasks.append(Task(f"t{i:02d}", model, MODELS[model], run, kb, kb, tuple(parents)))
    return tasks


@st.composite
def clusters(draw: st.DrawFn) -> list[GpuState]:
    per_node = draw(st.integers(1, 4))
    cluster = []
    for i in range(draw(st.integers(1, 10))):
        resident = draw(st.sampled_from([{}, {}, {"a": 4000.0}, {"b": 5000.0, "c": 3000.0}]))
        backlog = tuple(draw(st.lists(pendings, max_size=3)))
        free_at = draw(st.sampled_from([NOW, NOW, 180.0]))
        node = f"n{i // per_node}"
        cluster.append(GpuState(f"{node}/{i % per_node}", node, free_at, resident, 0.0, backlog))
    return cluster


@settings(max_examples=200, deadline=None)
@given(
    workflows(),
    clusters(),
    st.sampled_from([PlanMode.COMPASS, PlanMode.HEFT]),
    costs,
    st.sampled_from(["", "p1"]),
)
def test_a_plan_chooses_as_weighing_every_gpu_fully_would(
    tasks: list[Task], cluster: list[GpuState], mode: PlanMode, with_costs: Costs, name: str
) -> None:
    """The plan leaves out GPUs sure not to start a task first (alike idle ones, busy
    ones, those past the best start so far); weighing all of them, each in full,
    must choose the same GPUs and times, in the planner's order of ties too."""
    workflow = build_workflow("w", tasks, gpu_memory_mb=10_000)

    def weigh_all(self: object, task: Task, arrivals: object, start: Weigh) -> None:
        for gpu in cluster:
            start(gpu.gpu_id, math.inf)

    short = [dataclasses.replace(g) for g in cluster]
    plan = Planner(with_costs, mode, GpuOrder(name)).plan(workflow, short, NOW, job_id="j")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Shortlist, "weigh", weigh_all)
        full = [dataclasses.replace(g) for g in cluster]
        planner = Planner(with_costs, mode, GpuOrder(name))
        assert planner.plan(workflow, full, NOW, job_id="j") == plan
    assert [g.backlog for g in short] == [g.backlog for g in full]
