"""A workflow's order and look-ups: what their definitions say, however large the DAG."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core.compass import Task, Workflow, WorkflowError, build_workflow


def rounds_by_definition(tasks: list[Task]) -> list[str] | None:
    """Each round takes, by id, every task whose parents all came in earlier rounds;
    None when a round can take none (there is a cycle)."""
    order: list[str] = []
    left = {t.task_id: t for t in tasks}
    while left:
        ready = sorted(i for i, t in left.items() if set(t.parents) <= set(order))
        if not ready:
            return None
        order += ready
        for task_id in ready:
            del left[task_id]
    return order


def in_a_cycle(task_id: str, tasks: list[Task]) -> bool:
    """Whether following parents from the task leads back to it."""
    parents = {t.task_id: t.parents for t in tasks}
    seen, frontier = set(), list(parents[task_id])
    while frontier:
        current = frontier.pop()
        if current == task_id:
            return True
        if current not in seen:
            seen.add(current)
            frontier += parents[current]
    return False


@st.composite
def graphs(draw: st.DrawFn) -> list[Task]:
    ids = draw(st.lists(st.text("abcdef", min_size=1, max_size=3), min_size=1, unique=True))
    return [
        Task(i, "", 0.0, 1.0, 1.0, 1.0, tuple(draw(st.lists(st.sampled_from(ids), max_size=3))))
        for i in ids
    ]


@settings(max_examples=400, deadline=None)
@given(graphs())
def test_tasks_come_in_rounds_by_id_and_a_cycle_is_named(tasks: list[Task]) -> None:
    expected = rounds_by_definition(tasks)
    if expected is None:
        with pytest.raises(WorkflowError, match=r"^w/\w+: part of a cycle$") as error:
            build_workflow("w", tasks, 1.0)
        named = str(error.value).removeprefix("w/").split(":")[0]
        assert in_a_cycle(named, tasks)  # the task named is in one, not merely after one
        return
    workflow = build_workflow("w", tasks, 1.0)
    assert [t.task_id for t in workflow.tasks] == expected
    for task in workflow.tasks:
        assert workflow.task(task.task_id) is task
        assert workflow.children(task.task_id) == tuple(
            t.task_id for t in workflow.tasks if task.task_id in t.parents
        )


def test_a_workflow_not_yet_checked_looks_up_the_first_task_of_an_id() -> None:
    first, second = Task("a", "m", 1.0, 1.0, 1.0, 1.0), Task("a", "n", 1.0, 2.0, 1.0, 1.0)
    workflow = Workflow("w", (first, second, Task("b", "", 0.0, 1.0, 1.0, 1.0, ("a", "a"))))
    assert workflow.task("a") is first
    assert workflow.children("a") == ("b",)  # once, however often it names its parent
    assert workflow.models == frozenset({"m", "n"})
    assert workflow.largest_model_mb == 1.0


def test_the_best_case_is_the_longest_chain_of_run_times() -> None:
    # a(10) -> b(5) -> d(1); a -> c(20) -> d: the path through c is the longest.
    def task(name: str, run_ms: float, *parents: str) -> Task:
        return Task(name, "", 0.0, run_ms, 1.0, 1.0, parents)

    tasks = [task("a", 10), task("b", 5, "a"), task("c", 20, "a"), task("d", 1, "b", "c")]
    assert build_workflow("w", tasks, 1.0).best_case_ms == 31.0
