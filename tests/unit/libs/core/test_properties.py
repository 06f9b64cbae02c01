"""Properties of the core that must hold for any input sequence (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.core import Input, JobArrived, NodeJoined, Place, Scheduler, TaskEnded, Tick
from tests.builders import job, node


@st.composite
def histories(draw: st.DrawFn) -> list[Input]:
    nodes = draw(st.integers(1, 4))
    inputs: list[Input] = [
        NodeJoined(0, node(f"n{i}", draw(st.sampled_from([1, 2, 4, 8])))) for i in range(nodes)
    ]
    jobs = 0
    for step in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["arrive", "arrive", "end", "tick"]))
        if kind == "arrive":
            inputs.append(JobArrived(step, f"j{jobs}", job(draw(st.sampled_from([1, 2, 4, 8])))))
            jobs += 1
        elif kind == "end" and jobs:
            victim = draw(st.integers(0, jobs - 1))
            inputs.append(TaskEnded(step, f"j{victim}", f"j{victim}/0", "?"))
        else:
            inputs.append(Tick(step))
    return inputs


def _run(inputs: list[Input]) -> tuple[list[object], list[bytes]]:
    scheduler = Scheduler()
    decisions: list[object] = []
    digests: list[bytes] = []
    for item in inputs:
        # An end names the node where the job really runs.
        if isinstance(item, TaskEnded):
            placed = [d for d in decisions if isinstance(d, Place) and d.job_id == item.job_id]
            if not placed:
                continue
            item = TaskEnded(item.at, item.job_id, item.task_id, placed[-1].node_id)
        decisions.extend(scheduler.handle(item))
        digests.append(scheduler.digest())
    return decisions, digests


@settings(max_examples=200, deadline=None)
@given(histories())
def test_a_gpu_is_never_held_by_two_tasks(inputs: list[Input]) -> None:
    held: dict[tuple[str, int], str] = {}
    scheduler = Scheduler()
    placements: dict[str, Place] = {}
    for item in inputs:
        if isinstance(item, TaskEnded):
            place = placements.pop(item.job_id, None)
            if place is None:
                continue
            item = TaskEnded(item.at, item.job_id, place.task_id, place.node_id)
            for gpu in place.gpu_indices:
                del held[(place.node_id, gpu)]
        for decision in scheduler.handle(item):
            if isinstance(decision, Place):
                placements[decision.job_id] = decision
                for gpu in decision.gpu_indices:
                    key = (decision.node_id, gpu)
                    assert key not in held, f"GPU {key} given to {decision.job_id} and {held[key]}"
                    held[key] = decision.job_id


@settings(max_examples=100, deadline=None)
@given(histories())
def test_the_same_input_gives_the_same_output(inputs: list[Input]) -> None:
    assert _run(inputs) == _run(inputs)
