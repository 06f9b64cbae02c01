"""A workflow's order and look-ups: what their definitions say, however large the DAG."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core.compass import Task, Workflow, WorkflowError, build_workflow


def rounds_by_definition(tasks: list[Task]) -> list[str] | str:
    """Each round takes, by id, every task whose parents all came in earlier rounds;
    a round that can take none names the least id left as part of a cycle."""
    order: list[str] = []
    left = {t.task_id: t for t in tasks}
    while left:
        ready = sorted(i for i, t in left.items() if set(t.parents) <= set(order))
        if not ready:
            return f"w/{min(left)}: part of a cycle"
        order += ready
        for task_id in ready:
            del left[task_id]
    return order


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
    if isinstance(expected, str):
        with pytest.raises(WorkflowError) as error:
            build_workflow("w", tasks, 1.0)
        assert str(error.value) == expected
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
