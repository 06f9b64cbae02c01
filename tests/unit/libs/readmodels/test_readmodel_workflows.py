"""The job fold for workflow jobs: per-task facts, the job derived from them, any order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.events.wire_time import duration_ms
from libs.readmodels import JobRecords, has_ended, job_key, task_is_over
from libs.readmodels.job_state import WAITING
from tests.unit.libs.readmodels.folds import folded_job
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    cancelled,
    env,
    failed,
    finished,
    idle,
    pending,
    placed,
    requeued,
    started,
    stop,
    submitted,
)

S = types_pb2.JobState
J = "j-wf"


def task(name: str, *parents: str, model: str = "") -> types_pb2.WorkflowTask:
    return types_pb2.WorkflowTask(
        task_id=name,
        model=model,
        model_mb=100 if model else 0,
        run_duration=duration_ms(10),
        in_kb=1,
        out_kb=1,
        parents=parents,
    )


# opt -> (mt5_a, mt5_b) -> aggregate; given out of order: the fold uses workflow order.
WORKFLOW = types_pb2.Workflow(
    name="translation",
    tasks=[
        task("aggregate", "mt5_a", "mt5_b"),
        task("mt5_b", "opt", model="mt5"),
        task("mt5_a", "opt", model="mt5"),
        task("opt", model="OPT"),
    ],
)
ORDER = ["opt", "mt5_a", "mt5_b", "aggregate"]
SPEC = types_pb2.JobSpec(allocation="team-a", user="ada", gpus=1, workflow=WORKFLOW)


def wf_placed(
    name: str, node: str, gpu: int, at: float = T0, planned: tuple[str, int] | None = None
) -> events_pb2.Envelope:
    serving = events_pb2.ServingTask(name=name, model="m", run_duration=duration_ms(10))
    if planned is not None:
        serving.planned_node_id, serving.planned_gpu_index = planned
        serving.reason = "adjusted"
    payload = events_pb2.TaskPlaced(
        job_id=J, task_id=f"{J}/{name}", node_id=node, gpu_indices=[gpu], spec=SPEC, serving=serving
    )
    return env(payload, at)


def plan(*tasks: tuple[str, str, int], at: float = T0) -> events_pb2.Envelope:
    payload = events_pb2.WorkflowPlanned(
        job_id=J,
        mode="compass",
        tasks=[events_pb2.PlannedTask(name=n, node_id=node, gpu_index=g) for n, node, g in tasks],
    )
    return env(payload, at)


def t(name: str) -> str:
    return f"{J}/{name}"


def run(name: str, node: str, gpu: int, start: float, end: float) -> list[events_pb2.Envelope]:
    return [
        wf_placed(name, node, gpu, at=start),
        started(J, node, at=start + 0.1, task=t(name)),
        finished(J, node=node, at=end, task=t(name)),
    ]


ALL_RUN = [
    submitted(J, s=SPEC, at=T0),
    admitted(J, s=SPEC, at=T0),
    plan(("opt", "n1", 0), ("mt5_a", "n1", 1), ("mt5_b", "n2", 0), ("aggregate", "n1", 0)),
    *run("opt", "n1", 0, T0 + 1, T0 + 2),
    *run("mt5_a", "n1", 1, T0 + 2, T0 + 3),
    *run("mt5_b", "n2", 0, T0 + 2, T0 + 4),
    *run("aggregate", "n1", 0, T0 + 4, T0 + 5),
]


def test_a_planned_workflow_waits_with_its_tasks_planned() -> None:
    job = folded_job(ALL_RUN[:3])
    assert job.state == S.JOB_STATE_PENDING
    assert [(x.name, x.state, x.planned_node_id, x.planned_gpu_index) for x in job.tasks] == [
        ("opt", S.JOB_STATE_PENDING, "n1", 0),
        ("mt5_a", S.JOB_STATE_PENDING, "n1", 1),
        ("mt5_b", S.JOB_STATE_PENDING, "n2", 0),
        ("aggregate", S.JOB_STATE_PENDING, "n1", 0),
    ]


def test_placed_then_running_once_any_task_starts() -> None:
    job = folded_job(ALL_RUN[:4])
    assert job.state == S.JOB_STATE_PLACED
    job = folded_job(ALL_RUN[:5])
    assert job.state == S.JOB_STATE_RUNNING
    assert job.started_at.seconds == int(T0 + 1.1)
    assert (job.node_id, list(job.gpu_indices)) == ("", [])  # each task has its own
    opt = job.tasks[0]
    assert (opt.name, opt.state, opt.node_id, opt.gpu_index) == (
        "opt",
        S.JOB_STATE_RUNNING,
        "n1",
        0,
    )


def test_a_workflows_head_alone_says_it_waits_no_more_once_a_task_is_placed() -> None:
    """What counts waiting jobs (the projector's metrics) reads heads, not tasks."""
    for cut, waits in ((3, True), (4, False), (len(ALL_RUN), False)):
        records = JobRecords({}, {}, {})
        for envelope in ALL_RUN[:cut]:
            records.apply(envelope)
        [head] = records.heads_with_specs()
        assert (head.state in WAITING) is waits, cut


def test_still_running_while_any_task_is_left() -> None:
    job = folded_job(ALL_RUN[:-1])
    assert job.state == S.JOB_STATE_RUNNING
    assert not has_ended(job)
    assert task_is_over(job, t("opt")) and not task_is_over(job, t("aggregate"))


def test_finished_when_every_task_finished() -> None:
    job = folded_job(ALL_RUN)
    assert job.state == S.JOB_STATE_FINISHED and has_ended(job)
    assert [x.name for x in job.tasks] == ORDER
    assert all(x.state == S.JOB_STATE_FINISHED for x in job.tasks)
    assert [(x.node_id, x.gpu_index) for x in job.tasks] == [
        ("n1", 0),
        ("n1", 1),
        ("n2", 0),
        ("n1", 0),
    ]
    assert job.finished_at.seconds == int(T0 + 5) and job.exit_code == 0


def test_failed_when_one_task_fails() -> None:
    events = [
        *ALL_RUN[:7],
        wf_placed("mt5_b", "n2", 0, at=T0 + 2),
        failed(J, "CUDA out of memory", node="n2", exit_code=3, at=T0 + 2.5, task=t("mt5_b")),
    ]
    job = folded_job(events)
    assert job.state == S.JOB_STATE_FAILED and has_ended(job)
    assert job.reason == "task mt5_b failed: CUDA out of memory"
    assert job.exit_code == 3 and job.finished_at.seconds == int(T0 + 2.5)
    mt5_b = next(x for x in job.tasks if x.name == "mt5_b")
    assert (mt5_b.state, mt5_b.exit_code, mt5_b.reason) == (
        S.JOB_STATE_FAILED,
        3,
        "CUDA out of memory",
    )


def test_an_adjusted_task_keeps_where_it_was_planned() -> None:
    job = folded_job([submitted(J, s=SPEC), wf_placed("opt", "n3", 2, planned=("n1", 0))])
    opt = job.tasks[0]
    assert (opt.node_id, opt.gpu_index, opt.planned_node_id, opt.planned_gpu_index) == (
        "n3",
        2,
        "n1",
        0,
    )


def test_cancelling_a_running_workflow() -> None:
    events = [
        *ALL_RUN[:5],
        stop(J, "cancelled", cause=types_pb2.STOP_CAUSE_CANCELLED, task=t("opt")),
        failed(J, "stopped", exit_code=-15, at=T0 + 1.5, task=t("opt")),
    ]
    job = folded_job(events)
    assert job.state == S.JOB_STATE_CANCELLED
    job = folded_job([*events[:-1], cancelled(J, "cancelled by user")])
    assert job.state == S.JOB_STATE_CANCELLED and job.reason == "cancelled by user"
    assert task_is_over(job, t("mt5_a"))


def test_idle_reports_and_requeues_do_not_disturb_a_workflow() -> None:
    job = folded_job([*ALL_RUN[:5], idle(J, task=t("opt")), requeued(J), pending(J, "late")])
    assert job.state == S.JOB_STATE_RUNNING and not job.idle and job.reason == ""
    assert job.tasks[0].state == S.JOB_STATE_RUNNING


def test_task_events_before_the_spec_are_kept_and_ordered_once_it_comes() -> None:
    events = [
        started(J, "n2", at=T0 + 2, task=t("mt5_b")),
        started(J, "n1", at=T0 + 1, task=t("opt")),
        submitted(J, s=SPEC),
    ]
    job = folded_job(events[:2])
    assert [x.name for x in job.tasks] == ["mt5_b", "opt"]  # by name while unknown
    job = folded_job(events)
    assert [x.name for x in job.tasks] == ["opt", "mt5_b"]
    assert job.state == S.JOB_STATE_RUNNING and job.started_at.seconds == int(T0 + 1)
    assert job.attempts == 0


def test_workflow_plans_are_job_events() -> None:
    assert job_key(plan(("opt", "n1", 0))) == J


def test_a_broken_workflow_runs_as_the_scheduler_runs_it_a_plain_job() -> None:
    broken = types_pb2.JobSpec(
        allocation="team-a",
        user="ada",
        gpus=1,
        workflow=types_pb2.Workflow(name="w", tasks=[task("a", "a")]),
    )
    job = folded_job([submitted(J, s=broken), placed(J, "n1", [0]), started(J), finished(J)])
    assert job.state == S.JOB_STATE_FINISHED and job.attempts == 1
    assert (job.node_id, list(job.gpu_indices), list(job.tasks)) == ("n1", [0], [])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(ALL_RUN)), st.booleans(), st.data())
def test_any_arrival_order_gives_the_same_job(cut: int, fail: bool, data: st.DataObject) -> None:
    events = list(ALL_RUN[:cut])
    if fail:
        events += [
            wf_placed("mt5_a", "n1", 1, at=T0 + 2),
            failed(J, "boom", node="n1", exit_code=1, at=T0 + 2.2, task=t("mt5_a")),
        ]
    if not events:
        return
    expected = folded_job(events)
    shuffled = data.draw(st.permutations(events), label="arrival order")
    repeats = data.draw(st.lists(st.sampled_from(events), max_size=3), label="repeats")
    assert folded_job([*shuffled, *repeats]) == expected
