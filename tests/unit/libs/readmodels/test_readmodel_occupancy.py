"""The console's occupancy timeline and owed/delivered integrals, folded from samples."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import types_pb2

from libs.readmodels.dashboard import dashboard
from libs.readmodels.jobs import Scope
from libs.readmodels.occupancy import Sample, Timeline, history, sample

_S = types_pb2.JobState


def node(
    node_id: str,
    gpus: int,
    gpu_type: str = "A100",
    *,
    lost: bool = False,
    running: tuple[tuple[str, int], ...] = (),
) -> types_pb2.Node:
    """``running``: (job id, GPUs) of each task, on the first free indices."""
    tasks, used = [], 0
    for job_id, count in running:
        indices = list(range(used, used + count))
        tasks.append(
            types_pb2.RunningTask(job_id=job_id, task_id=f"{job_id}-0", gpu_indices=indices)
        )
        used += count
    return types_pb2.Node(
        inventory=types_pb2.NodeInventory(
            node_id=node_id, gpus=[types_pb2.Gpu(index=i, type=gpu_type) for i in range(gpus)]
        ),
        running=tasks,
        lost=lost,
    )


def job(
    job_id: str,
    allocation: str,
    gpus: int,
    state: int,
    *,
    user: str = "alice",
    charged: bool = True,
    idle: bool = False,
    gpu_type: str = "",
) -> types_pb2.Job:
    return types_pb2.Job(
        job_id=job_id,
        state=state,  # type: ignore[arg-type]
        idle=idle,
        reason="waiting for room" if state == _S.JOB_STATE_PENDING else "",
        spec=types_pb2.JobSpec(
            allocation=allocation,
            user=user,
            gpus=gpus,
            gpu_type=gpu_type,
            min_runtime=Duration(seconds=60 if charged else 0),
            command=["true"],
        ),
    )


def test_a_sample_counts_gpus_by_node_state_and_demand_by_allocation() -> None:
    jobs = [
        job("a", "vision", 4, _S.JOB_STATE_RUNNING, idle=True),
        job("b", "nlp", 2, _S.JOB_STATE_RUNNING, charged=False),
        job("c", "vision", 2, _S.JOB_STATE_PENDING),
        job("d", "nlp", 64, _S.JOB_STATE_PENDING),  # larger than the cluster: no demand
        job("e", "nlp", 1, _S.JOB_STATE_PENDING, gpu_type="B200"),  # no such GPU: no demand
    ]
    nodes = [
        node("n0", 8, running=(("a", 4), ("b", 2))),
        node("n1", 4, lost=True, running=(("gone", 4),)),
    ]
    got = sample(100.0, nodes, jobs)
    assert (got.capacity, got.busy, got.idle, got.lost) == (8, 6, 4, 4)
    assert got.held == {"vision": 4}
    assert got.held_free == {"nlp": 2}
    assert got.asked == {"vision": 2}


def test_owed_is_capped_by_entitlement_and_demand_and_delivered_is_what_is_held() -> None:
    timeline = Timeline(window_s=1000.0)
    shares = {"vision": 0.5, "nlp": 0.5}
    # 10 s: vision holds 2 and asks 6 (owed min(4, 8) = 4); nlp holds 1, asks none (owed 1).
    timeline.add(Sample(0.0, 8, 3, 0, 0, {"vision": 2, "nlp": 1}, {"vision": 6}), shares)
    timeline.add(Sample(10.0, 8, 3, 0, 0, {"vision": 2, "nlp": 1}, {"vision": 6}), shares)
    accounts = timeline.accounts()
    assert accounts["vision"].owed == pytest.approx(40.0)
    assert accounts["vision"].delivered == pytest.approx(20.0)
    assert accounts["vision"].delivered_pct == pytest.approx(50.0)
    assert accounts["nlp"].delivered_pct == pytest.approx(100.0)
    assert timeline.span_s == 10.0


def test_the_window_slides_and_a_step_back_in_time_is_ignored() -> None:
    timeline = Timeline(window_s=100.0)
    busy = Sample(0.0, 4, 4, 0, 0, {"vision": 4})
    timeline.add(busy, {"vision": 1.0})
    timeline.add(Sample(50.0, 4, 0, 0, 0), {"vision": 1.0})  # held 4 for 50 s, then nothing
    timeline.add(Sample(40.0, 4, 4, 0, 0, {"vision": 4}), {"vision": 1.0})  # ignored
    assert timeline.accounts()["vision"].delivered == pytest.approx(200.0)
    timeline.add(Sample(400.0, 4, 0, 0, 0), {"vision": 1.0})
    assert timeline.accounts()["vision"].delivered == 0.0  # slid out of the window
    assert timeline.accounts()["vision"].delivered_pct is None  # nothing owed: no ratio
    assert [p.at for p in timeline.points()] == [0.0, 50.0, 400.0]


def test_a_user_sees_cluster_figures_but_only_jobs_and_allocations_in_scope() -> None:
    jobs = [
        job("mine", "vision", 2, _S.JOB_STATE_PENDING, user="alice"),
        job("theirs", "nlp", 2, _S.JOB_STATE_PENDING, user="bob"),
        job("run", "nlp", 4, _S.JOB_STATE_RUNNING, user="bob"),
    ]
    nodes = [node("n0", 4, running=(("run", 4),))]
    timeline = Timeline(window_s=1000.0)
    shares = {"vision": 0.5, "nlp": 0.5}
    timeline.add(sample(0.0, nodes, jobs), shares)
    timeline.add(sample(5.0, nodes, jobs), shares)
    alice = dashboard(
        user="alice",
        scope=Scope("alice", frozenset({"vision"})),
        now=5.0,
        timeline=timeline,
        nodes=nodes,
        jobs=jobs,
        entitlements=shares,
    )
    assert [w["job_id"] for w in alice["waiting"]] == ["mine"]
    assert alice["waiting"][0]["reason"] == "waiting for room"
    assert alice["waiting"][0]["estimated_start"] is None
    assert [a["allocation"] for a in alice["allocations"]] == ["vision"]
    assert alice["occupancy"]["now"] == {"capacity": 4, "busy": 4, "idle": 0, "lost": 0}
    assert alice["nodes"][0] | {"lost_reason": ""} == {
        "node_id": "n0",
        "gpu_type": "A100",
        "gpus": 4,
        "busy": 4,
        "idle": 0,
        "lost": False,
        "lost_reason": "",
    }
    everyone = dashboard(
        user="carol",
        scope=None,
        now=5.0,
        timeline=timeline,
        nodes=nodes,
        jobs=jobs,
        entitlements=shares,
    )
    assert {w["job_id"] for w in everyone["waiting"]} == {"mine", "theirs"}
    assert [a["allocation"] for a in everyone["allocations"]] == ["nlp", "vision"]
    assert everyone["sees_all"] and not alice["sees_all"]


def timed(
    job_id: str, allocation: str, gpus: int, submitted: float, started: float, ended: float
) -> types_pb2.Job:
    """A charged job of the history: it waited from ``submitted``, ran from ``started``
    (0: never) and ended at ``ended`` (0: not yet)."""
    state = (
        _S.JOB_STATE_FINISHED
        if ended
        else _S.JOB_STATE_RUNNING
        if started
        else _S.JOB_STATE_PENDING
    )
    done = job(job_id, allocation, gpus, state)
    done.submitted_at.FromNanoseconds(int(submitted * 1e9))
    if started:
        done.started_at.FromNanoseconds(int(started * 1e9))
    if ended:
        done.finished_at.FromNanoseconds(int(ended * 1e9))
    return done


def test_a_new_timeline_starts_from_the_jobs_history() -> None:
    """vision waits 100 s for 4 GPUs, runs them 200 s; nlp asks 8 from 200 s on, never
    placed. On 8 GPUs, vision (60 %) is owed 4 GPUs while it asks, nlp (40 %) 3.2."""
    jobs = [timed("v", "vision", 4, 100, 200, 400), timed("n", "nlp", 8, 200, 0, 0)]
    timeline = Timeline(window_s=1000)
    for past in history(jobs, capacity=8, since=0, now=500):
        timeline.add(past, {"vision": 0.6, "nlp": 0.4})
    timeline.add(sample(500, [node("n1", 8)], []), {"vision": 0.6, "nlp": 0.4})
    accounts = timeline.accounts()
    assert accounts["vision"].owed == pytest.approx(4 * 300)
    assert accounts["vision"].delivered == pytest.approx(4 * 200)
    assert accounts["nlp"].owed == pytest.approx(3.2 * 300) and accounts["nlp"].delivered == 0
    assert timeline.span_s == pytest.approx(400)


def test_history_before_the_window_is_the_state_it_starts_in() -> None:
    jobs = [timed("v", "vision", 4, 10, 20, 0)]
    # Nothing changed inside the window: the live sample carries the state.
    assert history(jobs, capacity=8, since=100, now=200) == []
    samples = history([*jobs, timed("w", "vision", 2, 150, 0, 0)], capacity=8, since=100, now=200)
    assert [(s.at, dict(s.held), dict(s.asked)) for s in samples] == [
        (150, {"vision": 4}, {"vision": 2})
    ]


def test_gpus_serving_holds_are_held_for_their_allocation_busy_or_idle() -> None:
    workflow = job("w", "serving", 1, _S.JOB_STATE_RUNNING)
    n0 = node("n0", 4, running=(("w", 1),))  # its task runs on GPU 0
    n0.serving.add(gpu_index=0, allocation="serving")
    n0.serving.add(gpu_index=1, allocation="serving")  # the warm one
    got = sample(100.0, [n0], [workflow])
    assert (got.capacity, got.busy, got.idle) == (4, 2, 1)
    assert got.held == {"serving": 2}  # GPU 0 counted once, not again for its task


def test_the_node_list_counts_serving_gpus_as_the_occupancy_does() -> None:
    workflow = job("w", "serving", 1, _S.JOB_STATE_RUNNING)
    n0 = node("n0", 4, running=(("w", 1),))  # its task runs on GPU 0
    n0.serving.add(gpu_index=0, allocation="serving")
    n0.serving.add(gpu_index=1, allocation="serving")  # warm, nothing running
    timeline = Timeline(window_s=1000.0)
    timeline.add(sample(0.0, [n0], [workflow]), {"serving": 1.0})
    page = dashboard(
        user="carol",
        scope=None,
        now=0.0,
        timeline=timeline,
        nodes=[n0],
        jobs=[workflow],
        entitlements={"serving": 1.0},
    )
    listed = page["nodes"][0]
    assert (listed["busy"], listed["idle"]) == (2, 1)
    now = page["occupancy"]["now"]
    assert (now["busy"], now["idle"]) == (listed["busy"], listed["idle"])
