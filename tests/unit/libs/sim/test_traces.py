"""Trace parsing: times, sizes and ids exactly as each trace's format defines them."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.events import new_envelope
from libs.events.logfile import write_log
from libs.sim.scenario import Scenario, build_workload
from libs.sim.traces import (
    RawJob,
    TraceError,
    load_csv,
    load_event_log,
    parse_alibaba,
    parse_csv_trace,
    parse_dirlab,
    select,
)
from libs.sim.traces.eventlog import (
    CANCELLED,
    NEVER_STARTED,
    NO_TIME,
    STILL_RUNNING,
    STILL_WAITING,
    excerpt,
)

DATA = Path(__file__).resolve().parents[5] / "shared" / "data"
DIRLAB_HEADER = "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\r\n"


def _dirlab(rows: str, prefix: str, gpus_column: str = "gpu_num") -> list[RawJob]:
    return parse_dirlab(io.StringIO(DIRLAB_HEADER + rows, newline=""), prefix, gpus_column)


def test_philly_times_are_running_sums_of_the_gap_in_file_order() -> None:
    jobs = _dirlab(
        "0,1,1,0,1,0,100,0,Pass\r\n"
        "2,2,16,0,2,30,50,0,Killed\r\n"  # u_id out of file order, as in the real file
        "1,1,8,0,1,0,7,0,Failed\r\n",
        "philly",
    )
    assert jobs == [  # wall_time 0: no requested limit
        RawJob("philly-0", 0.0, "user-1", 1, 100.0, 1, status="Pass"),
        RawJob("philly-2", 30.0, "user-2", 16, 50.0, 2, status="Killed"),
        RawJob("philly-1", 30.0, "user-1", 8, 7.0, 1, status="Failed"),
    ]


def test_bluewaters_keeps_the_requested_limit_and_its_cpu_jobs_with_no_gpus() -> None:
    jobs = _dirlab(
        "7,u17,100,0,100,0,5000,21600,Pass\r\n"  # user ids are text
        "8,3,0,32,1,10,60,3600,Killed\r\n",  # CPU only: the scheduler rejects it
        "bluewaters",
    )
    assert [(j.job_id, j.user, j.gpus, j.nodes, j.requested_s, j.status) for j in jobs] == [
        ("bluewaters-7", "user-u17", 100, 100, 21600.0, "Pass"),
        ("bluewaters-8", "user-3", 0, 1, 3600.0, "Killed"),
    ]


def test_theta_counts_one_gpu_per_knl_node() -> None:
    (job,) = _dirlab("0,4,0,8192,128,0,1400,3600,Failed\r\n", "theta", gpus_column="node_num")
    assert (job.job_id, job.gpus, job.nodes, job.requested_s) == ("theta-0", 128, 128, 3600.0)


def test_a_file_in_another_format_is_refused_with_the_missing_columns() -> None:
    with pytest.raises(TraceError, match="missing columns"):
        parse_dirlab(io.StringIO("a,b\n1,2\n"), "philly")
    with pytest.raises(TraceError, match="row 2, column gpu_num: expected a whole number"):
        _dirlab("0,1,one,0,1,0,5,0,Pass\r\n", "philly")


CSV_HEADER = "job_id,submit_s,user,team,gpus,nodes,gpu_type,runtime_s,requested_s,status\n"


def test_a_csv_trace_keeps_what_it_states_and_leaves_the_rest_unknown() -> None:
    text = CSV_HEADER + (
        "train-9,120,alice,vision,16,2,H100,7200,10800,Pass\n"
        ",60,007,,1,,,30,,\n"  # ids stay text: 007 is not 7; no id: the row names it
    )
    assert parse_csv_trace(io.StringIO(text)) == [  # replayed in submission order
        RawJob("row-3", 60.0, "007", 1, 30.0),
        RawJob(
            "train-9",
            120.0,
            "alice",
            16,
            7200.0,
            nodes=2,
            requested_s=10800.0,
            status="Pass",
            team="vision",
            gpu_type="H100",
        ),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("j,0,u,,two,,,5,,", "row 2, column gpus: expected a whole number >= 0, got 'two'"),
        ("j,0,u,,-1,,,5,,", "row 2, column gpus: expected a whole number >= 0, got '-1'"),
        ("j,0,,,1,,,5,,", "row 2, column user: required, found an empty cell"),
        ("j,soon,u,,1,,,5,,", "row 2, column submit_s: expected a number, got 'soon'"),
        ("j,0,u,,1,,,5,inf,", "row 2, column requested_s: expected seconds >= 0, got 'inf'"),
    ],
)
def test_a_bad_csv_row_names_its_row_and_column(row: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_csv_trace(io.StringIO(CSV_HEADER + row + "\n"))
    assert str(caught.value) == message


def test_a_csv_trace_without_a_documented_column_is_refused() -> None:
    with pytest.raises(TraceError, match=r"missing columns \['requested_s'\]"):
        parse_csv_trace(io.StringIO(CSV_HEADER.replace("requested_s", "requsted_s")))


ALIBABA_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_alibaba_pods_round_shared_gpus_up_and_keep_cpu_only_pods_with_no_gpus() -> None:
    text = ALIBABA_HEADER + (
        "openb-pod-0001,1000,100,1,470,,BE,Running,200,500,210\n"
        "openb-pod-0000,1000,100,0,0,,LS,Running,100,900,100\n"  # CPU only
        "openb-pod-0002,1000,100,8,1000,,Guaranteed,Succeeded,150,350,160\n"
        "openb-pod-0003,1000,100,1,1000,,LS,Pending,150,180,\n"  # never scheduled
    )
    jobs = parse_alibaba(io.StringIO(text))
    assert [(j.job_id, j.at, j.gpus, j.runtime_s, j.best_effort, j.priority) for j in jobs] == [
        ("openb-pod-0000", 100.0, 0, 800.0, False, 1),  # the scheduler rejects it
        ("openb-pod-0002", 150.0, 8, 190.0, False, 2),
        ("openb-pod-0003", 150.0, 1, 30.0, False, 1),
        ("openb-pod-0001", 200.0, 1, 290.0, True, -1),
    ]


def test_select_skips_the_head_then_keeps_a_time_window() -> None:
    jobs = [RawJob(f"j{i}", float(i * 10), "u", 1, 1.0) for i in range(10)]
    picked = select(jobs, skip_head=2, start_s=30.0, end_s=70.0)
    assert [j.job_id for j in picked] == ["j3", "j4", "j5", "j6"]


def test_a_recorded_log_gives_submissions_nodes_budget_and_cancellations(tmp_path: Path) -> None:
    def env(payload: Message, second: int) -> events_pb2.Envelope:
        at = datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)
        return new_envelope(payload, producer="test", occurred=at, event_id=f"e{second}")

    spec = types_pb2.JobSpec(
        allocation="a", user="u", gpus=2, command=["x"], min_runtime=Duration(seconds=60)
    )
    tree = types_pb2.BudgetTree(
        nodes=[
            types_pb2.BudgetNode(name="root", weight=1),
            types_pb2.BudgetNode(name="a", parent="root", weight=1),
        ]
    )
    inventory = types_pb2.NodeInventory(
        node_id="n1", gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(4)]
    )
    envelopes = [
        env(events_pb2.BudgetChanged(tree=tree), 0),
        env(events_pb2.NodeRegistered(inventory=inventory), 1),
        env(events_pb2.JobAdmitted(job_id="j1", spec=spec), 2),
        env(events_pb2.TaskStarted(job_id="j1", task_id="j1/0", node_id="n1"), 3),
        env(events_pb2.TaskFinished(job_id="j1", task_id="j1/0", node_id="n1"), 13),
        env(events_pb2.JobAdmitted(job_id="j2", spec=spec), 4),  # never ran: no runtime
        env(events_pb2.JobCancelRequested(job_id="j2"), 5),
    ]
    path = tmp_path / "run.qmlog"
    write_log(path, envelopes)
    log = load_event_log(path)
    assert [(j.job_id, j.runtime_s) for j in log.jobs] == [("j1", 10.0)]
    assert [(j.job_id, j.why) for j in log.left_out] == [("j2", CANCELLED)]
    assert [n.node_id for n in log.nodes] == ["n1"]
    assert log.tree is not None and log.tree.leaves() == ["a"]
    assert [job for _, job in log.cancels] == ["j2"]


def test_a_recorded_job_with_no_run_to_replay_is_left_out_saying_why(tmp_path: Path) -> None:
    def env(payload: Message, second: int) -> events_pb2.Envelope:
        at = datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)
        return new_envelope(payload, producer="test", occurred=at, event_id=f"e{second}")

    def task(message: Callable[..., Message], job: str, n: int, second: int) -> events_pb2.Envelope:
        return env(message(job_id=job, task_id=f"{job}/{n}", node_id="n1"), second)

    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["x"])
    envelopes = [
        env(events_pb2.JobAdmitted(job_id=j, spec=spec), i) for i, j in enumerate("abcdef")
    ]
    envelopes += [
        task(events_pb2.TaskStarted, "a", 0, 10),
        task(events_pb2.TaskFinished, "a", 0, 20),  # ran 10 s: replayed
        task(events_pb2.TaskFailed, "b", 0, 21),  # could not start (exit 126)
        task(events_pb2.TaskFailed, "b", 1, 22),
        task(events_pb2.TaskStarted, "c", 0, 23),  # requeued: its next run is on its way
        task(events_pb2.TaskFinished, "c", 0, 23),
        task(events_pb2.TaskStarted, "c", 1, 24),
        env(events_pb2.JobCancelRequested(job_id="d"), 25),
        task(events_pb2.TaskStarted, "f", 0, 26),
        task(events_pb2.TaskFinished, "f", 0, 26),
    ]  # e waits
    path = tmp_path / "run.qmlog"
    write_log(path, envelopes)
    log = load_event_log(path)
    assert [job.job_id for job in log.jobs] == ["a"]
    assert [(j.job_id, j.why) for j in log.left_out] == [
        ("b", NEVER_STARTED),
        ("c", STILL_RUNNING),
        ("d", CANCELLED),
        ("e", STILL_WAITING),
        ("f", NO_TIME),
    ]


def test_a_window_cuts_a_recorded_logs_submissions_alike_replayed_or_left_out(
    tmp_path: Path,
) -> None:
    def env(payload: Message, second: int) -> events_pb2.Envelope:
        at = datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)
        return new_envelope(payload, producer="test", occurred=at, event_id=f"e{second}")

    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["x"])
    tree = types_pb2.BudgetTree(
        nodes=[
            types_pb2.BudgetNode(name="root", weight=1),
            types_pb2.BudgetNode(name="a", parent="root", weight=1),
        ]
    )
    inventory = types_pb2.NodeInventory(node_id="n1", gpus=[types_pb2.Gpu(index=0, type="H100")])
    envelopes = [
        env(events_pb2.BudgetChanged(tree=tree), 0),
        env(events_pb2.NodeRegistered(inventory=inventory), 1),
    ]
    envelopes += [
        env(events_pb2.JobAdmitted(job_id=j, spec=spec), 10 + i) for i, j in enumerate("abcde")
    ]
    for i, job in enumerate("bc"):  # a, d and e wait: left out
        started = events_pb2.TaskStarted(job_id=job, task_id=f"{job}/0", node_id="n1")
        ended = events_pb2.TaskFinished(job_id=job, task_id=f"{job}/0", node_id="n1")
        envelopes += [env(started, 20 + i), env(ended, 30 + i)]
    path = tmp_path / "run.qmlog"
    write_log(path, sorted(envelopes, key=lambda e: e.occurred_at.seconds))
    end = datetime(2026, 1, 1, 0, 0, 14, tzinfo=UTC).timestamp()  # e's submission
    workload = build_workload(Scenario("eventlog", path, skip_head=1, end_s=end), 3600.0)
    # The head skipped is the log's first submission, a; the window ends before e.
    assert [job.job_id for job in workload.jobs] == ["b", "c"]
    assert [job.job_id for job in workload.left_out] == ["d"]


def test_an_excerpt_replays_the_window_s_jobs_on_the_cluster_of_its_start(tmp_path: Path) -> None:
    def env(payload: Message, second: int) -> events_pb2.Envelope:
        at = datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)
        return new_envelope(payload, producer="test", occurred=at, event_id=f"e{second}")

    def node(node_id: str, gpus: int) -> events_pb2.NodeRegistered:
        inventory = types_pb2.NodeInventory(
            node_id=node_id, gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(gpus)]
        )
        return events_pb2.NodeRegistered(inventory=inventory)

    def tree(leaf: str) -> events_pb2.BudgetChanged:
        nodes = [
            types_pb2.BudgetNode(name="root", weight=1),
            types_pb2.BudgetNode(name=leaf, parent="root", weight=1),
        ]
        return events_pb2.BudgetChanged(tree=types_pb2.BudgetTree(nodes=nodes))

    def job(job_id: str, user: str) -> events_pb2.JobAdmitted:
        spec = types_pb2.JobSpec(allocation="b", user=user, gpus=2, command=["x"])
        return events_pb2.JobAdmitted(job_id=job_id, spec=spec)

    def run(job_id: str, began: int, ended: int) -> list[events_pb2.Envelope]:
        task = f"{job_id}/0"
        return [
            env(events_pb2.TaskStarted(job_id=job_id, task_id=task, node_id="n1"), began),
            env(events_pb2.TaskFinished(job_id=job_id, task_id=task, node_id="n1"), ended),
        ]

    history = [
        env(tree("a"), 0),
        env(node("n1", 4), 1),
        env(node("n2", 8), 2),
        env(tree("b"), 3),
        env(node("n1", 8), 4),  # re-registered: the later one stands
        env(job("early", "old"), 5),
        *run("early", 6, 12),  # ends inside the window, began before it
        env(job("j1", "ada"), 10),
        *run("j1", 11, 31),  # ends after the window: its runtime is kept
        env(job("j2", "bo"), 15),
        env(events_pb2.JobCancelRequested(job_id="j2"), 16),
        env(node("n3", 2), 17),  # joined in the window
        env(job("late", "cy"), 20),  # the window's end
    ]
    since = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp()
    until = since + 10
    # Partitions arrive interleaved: the excerpt puts them in order of time.
    cut = excerpt([*history[::2], *history[1::2]], since, until)
    path = tmp_path / "excerpt.qmlog"
    write_log(path, cut)
    log = load_event_log(path)
    assert [(j.job_id, j.spec.user, j.runtime_s) for j in log.jobs] == [("j1", "ada", 20.0)]
    assert [(j.job_id, j.why) for j in log.left_out] == [("j2", CANCELLED)]
    assert [(n.node_id, len(n.gpu_indices)) for n in log.nodes] == [("n1", 8), ("n2", 8), ("n3", 2)]
    assert log.tree is not None and log.tree.leaves() == ["b"]
    assert [job for _, job in log.cancels] == ["j2"]
    # After the last event: the cluster as it stands, nothing else.
    assert excerpt(history, until + 100) == [history[2], history[3], history[4], history[13]]


def test_a_truncated_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.qmlog"
    path.write_bytes(b"\x80")
    with pytest.raises(TraceError, match="record length"):
        load_event_log(path)


@pytest.mark.shared_data
def test_the_real_philly_file_parses_whole() -> None:
    jobs = load_csv(
        DATA / "philly-15k" / "philly_data_training.csv", partial(parse_dirlab, prefix="philly")
    )
    assert len(jobs) == 15_000
    assert jobs[-1].at == 4_977_039  # the sum of all intervals (data README)
    assert sum(j.gpus * j.runtime_s for j in jobs) == 2_756_749_794


@pytest.mark.shared_data
def test_the_real_gang_traces_parse_whole() -> None:
    blue = load_csv(
        DATA / "bluewaters-15k" / "blue_waters_data_training.csv",
        partial(parse_dirlab, prefix="bluewaters"),
    )
    gpu_jobs = [j for j in blue if j.gpus]
    assert (len(blue), len(gpu_jobs)) == (15_000, 3_403)  # data README section 3
    assert all(j.gpus == j.nodes for j in gpu_jobs)
    theta = load_csv(
        DATA / "theta-15k" / "theta_data_training.csv",
        partial(parse_dirlab, prefix="theta", gpus_column="node_num"),
    )
    assert sum(j.gpus == 128 for j in theta) == 4_451  # data README section 3
    assert all(j.requested_s for j in theta)


def test_an_openb_pod_list_without_times_is_refused_saying_why() -> None:
    sizes_only = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,1000,100,1,1000\n"
    with pytest.raises(TraceError, match="cannot be simulated over time"):
        parse_alibaba(io.StringIO(sizes_only))
