"""Jobs kept as records: each event writes little, and the job read is the job folded whole."""

from __future__ import annotations

from functools import reduce

from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.events.wire_time import duration_ms
from libs.readmodels import JobFilter, JobRecords, apply_job_event
from libs.readmodels.jobs import task_key
from tests.perf.workflow_bench import Counted
from tests.unit.libs.readmodels.readmodel_builders import (
    T0,
    admitted,
    env,
    finished,
    placed,
    started,
    stop,
    submitted,
)

S = types_pb2.JobState
J = "j-big"


def wide(n: int, job_id: str = J) -> types_pb2.JobSpec:
    """A root, n - 2 tasks on its output, and a join of them all."""
    tasks = [
        types_pb2.WorkflowTask(task_id="root", run_duration=duration_ms(10), in_kb=1, out_kb=1)
    ]
    middle = [f"m{i:04d}" for i in range(n - 2)]
    tasks += [
        types_pb2.WorkflowTask(
            task_id=m, model="mt5", model_mb=2000, run_duration=duration_ms(10), in_kb=1, out_kb=1
        )
        for m in middle
    ]
    tasks.append(
        types_pb2.WorkflowTask(
            task_id="join", run_duration=duration_ms(1), in_kb=1, out_kb=1, parents=middle
        )
    )
    for task in tasks[1:-1]:
        task.parents.append("root")
    return types_pb2.JobSpec(
        allocation="team-a", user="ada", gpus=1, workflow=types_pb2.Workflow(name="w", tasks=tasks)
    )


def names(spec: types_pb2.JobSpec) -> list[str]:
    return [t.task_id for t in spec.workflow.tasks]


def lifecycle(spec: types_pb2.JobSpec, job_id: str = J) -> list[events_pb2.Envelope]:
    """Submission, plan, then each task placed, started and finished, in workflow order."""
    plan = events_pb2.WorkflowPlanned(
        job_id=job_id,
        mode="compass",
        tasks=[events_pb2.PlannedTask(name=n, node_id="n1", gpu_index=0) for n in names(spec)],
    )
    events = [submitted(job_id, s=spec), admitted(job_id, s=spec), env(plan)]
    for i, name in enumerate(names(spec)):
        task_id = f"{job_id}/{name}"
        serving = events_pb2.ServingTask(name=name, model="mt5", run_duration=duration_ms(10))
        placed_task = events_pb2.TaskPlaced(
            job_id=job_id,
            task_id=task_id,
            node_id="n1",
            gpu_indices=[i % 8],
            spec=spec,
            serving=serving,
        )
        events += [
            env(placed_task, T0 + i),
            started(job_id, "n1", at=T0 + i + 0.1, task=task_id),
            finished(job_id, node="n1", at=T0 + i + 0.5, task=task_id),
        ]
    return events


def records() -> tuple[JobRecords, Counted, Counted, Counted]:
    heads, specs, tasks = Counted(), Counted(), Counted()
    return JobRecords(heads, specs, tasks), heads, specs, tasks


def test_a_large_workflow_costs_one_small_record_per_task_event() -> None:
    spec = wide(300)
    events = lifecycle(spec)
    book, heads, specs, tasks = records()
    for event in events:
        book.apply(event)
    job = book.job(J)
    assert job == reduce(apply_job_event, events, None)  # what folding it whole gives
    assert job is not None and job.state == S.JOB_STATE_FINISHED
    assert [t.name for t in job.tasks] == names(spec)
    # The spec once; the head on job events alone (not on the 900 task events); one
    # record per task change, each far smaller than the spec.
    assert specs.writes == 1
    assert heads.writes <= 4
    task_events = 3 * len(names(spec))
    assert tasks.writes <= task_events + len(names(spec))  # the plan writes each once
    written = heads.written + tasks.written  # the spec aside
    assert written / (task_events + 3) < 120
    assert len(spec.SerializeToString()) > 100 * 120


def test_a_repeated_event_writes_nothing() -> None:
    events = lifecycle(wide(10))
    book, heads, specs, tasks = records()
    for event in events:
        book.apply(event)
    before = (heads.writes, specs.writes, tasks.writes)
    for event in events:
        book.apply(event)
    assert (heads.writes, specs.writes, tasks.writes) == before


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_any_arrival_order_reads_as_the_job_folded_whole(data: st.DataObject) -> None:
    spec = wide(6)
    events = lifecycle(spec)
    events.append(stop(J, "cancelled", cause=types_pb2.STOP_CAUSE_CANCELLED, task=f"{J}/join"))
    shuffled = data.draw(st.permutations(events), label="arrival order")
    book, *_ = records()
    for event in shuffled:
        book.apply(event)
    assert (
        book.job(J)
        == reduce(apply_job_event, shuffled, None)
        == reduce(apply_job_event, events, None)
    )


def test_tasks_seen_before_the_spec_get_records_once_it_comes() -> None:
    spec = wide(5)
    book, heads, _, tasks = records()
    book.apply(started(J, "n1", at=T0 + 2, task=f"{J}/m0001"))
    book.apply(started(J, "n1", at=T0 + 1, task=f"{J}/root"))
    assert [t.name for t in types_pb2.Job.FromString(heads[J]).tasks] == ["m0001", "root"]
    assert len(tasks) == 0
    book.apply(submitted(J, s=spec))
    assert not types_pb2.Job.FromString(heads[J]).tasks  # moved to records of their own
    assert sorted(tasks) == sorted(task_key(J, n) for n in ("m0001", "root"))
    job = book.job(J)
    assert job is not None
    assert [t.name for t in job.tasks] == ["root", "m0001"]
    assert (job.state, job.started_at.seconds) == (S.JOB_STATE_RUNNING, int(T0 + 1))


def test_task_records_of_two_jobs_never_share_a_key() -> None:
    assert task_key("a/b", "c") != task_key("a", "b/c")
    book, *_ = records()
    for job_id, name in (("a/b", "c"), ("a", "b/c")):
        spec = types_pb2.JobSpec(
            allocation="team-a",
            gpus=1,
            workflow=types_pb2.Workflow(
                name="w",
                tasks=[
                    types_pb2.WorkflowTask(
                        task_id=name, run_duration=duration_ms(1), in_kb=1, out_kb=1
                    )
                ],
            ),
        )
        book.apply(submitted(job_id, s=spec))
        book.apply(started(job_id, "n1", task=f"{job_id}/{name}"))
    for job_id, name in (("a/b", "c"), ("a", "b/c")):
        job = book.job(job_id)
        assert job is not None
        assert [(t.name, t.state) for t in job.tasks] == [(name, S.JOB_STATE_RUNNING)]


def test_names_forgotten_for_want_of_room_are_read_again() -> None:
    roomy, *_ = records()
    heads, specs, tasks = Counted(), Counted(), Counted()
    tight = JobRecords(heads, specs, tasks, remembered=1)
    one, two = lifecycle(wide(5), "j-1"), lifecycle(wide(7), "j-2")
    for pair in zip(one, two, strict=False):
        for event in pair:
            roomy.apply(event)
            tight.apply(event)
    for job_id in ("j-1", "j-2"):
        assert tight.job(job_id) == roomy.job(job_id)


def test_a_job_kept_whole_reads_the_same_and_is_split_by_its_next_event() -> None:
    events = lifecycle(wide(5))
    whole = reduce(apply_job_event, events[:-1], None)
    assert whole is not None and whole.tasks
    book, heads, specs, tasks = records()
    heads[J] = whole.SerializeToString(deterministic=True)  # as the projector kept jobs
    assert book.job(J) == whole
    book.apply(events[-1])
    head = types_pb2.Job.FromString(heads[J])
    assert not head.HasField("spec") and not head.tasks
    assert (len(specs), len(tasks)) == (1, len(whole.tasks))
    assert book.job(J) == reduce(apply_job_event, events, None)


def test_jobs_lists_the_newest_first_with_their_tasks() -> None:
    book, *_ = records()
    for event in lifecycle(wide(4), "j-old"):
        book.apply(event)
    for event in (submitted("j-new", at=T0 + 100), placed("j-new")):
        book.apply(event)
    listed = book.jobs()
    assert [j.job_id for j in listed] == ["j-new", "j-old"]
    assert [len(j.tasks) for j in listed] == [0, 4]
    assert [j.job_id for j in book.jobs(where=JobFilter(allocation="team-a"), limit=1)] == ["j-new"]
    assert book.jobs(where=JobFilter(allocation="team-z")) == []
    assert [j.state for j in book.jobs()] == [S.JOB_STATE_PLACED, S.JOB_STATE_FINISHED]
    # A state is judged on the whole job: the workflow's is derived from its tasks.
    ended = JobFilter(states=frozenset({S.JOB_STATE_FINISHED}))
    assert [j.job_id for j in book.jobs(where=ended)] == ["j-old"]
    either = JobFilter(states=frozenset({S.JOB_STATE_FINISHED, S.JOB_STATE_PLACED}))
    assert [j.job_id for j in book.jobs(where=either, limit=1)] == ["j-new"]
    assert book.job("j-none") is None


def test_the_node_a_task_runs_on_is_its_placements() -> None:
    """What the gate checks a node's report on a task against."""
    book, *_ = records()
    for event in [
        submitted("gang"),
        placed("gang", "n2", [0], task="gang/0.1"),
        placed("gang", "n1", [0, 1], task="gang/0.0"),
        finished("early", node="n3"),  # its placement not read yet: its node's word
        *lifecycle(wide(4))[:4],  # j-big's first task placed on n1
    ]:
        book.apply(event)
    assert book.task_node("gang", "gang/0.0") == "n1"
    assert book.task_node("gang", "gang/0.1") == "n2"
    assert book.task_node("early", "early/0") == "n3"
    assert book.task_node(J, f"{J}/root") == "n1"
    assert book.task_node(J, f"{J}/join") is None  # planned, not placed
    assert book.task_node("gang", "gang/1.0") is None
    assert book.task_node("unknown", "unknown/0") is None
