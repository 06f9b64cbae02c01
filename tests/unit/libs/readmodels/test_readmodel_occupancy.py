"""The console's occupancy timeline and owed/delivered integrals, folded from samples."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import types_pb2

from libs.readmodels.dashboard import ENDED_SHOWN, dashboard
from libs.readmodels.jobs import Scope
from libs.readmodels.occupancy import Gpus, Sample, Timeline, history, sample

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
    assert got.total == Gpus(capacity=8, busy=6, idle=4, lost=4, lost_held=4)
    assert got.held == {"vision": 4}
    assert got.held_free == {"nlp": 2}
    assert got.asked == {"vision": 2}


def test_owed_is_capped_by_entitlement_and_demand_and_delivered_is_what_is_held() -> None:
    timeline = Timeline(window_s=1000.0)
    shares = {"vision": 0.5, "nlp": 0.5}
    # 10 s: vision holds 2 and asks 6 (owed min(4, 8) = 4); nlp holds 1, asks none (owed 1).
    gpus = {"A100": Gpus(capacity=8, busy=3)}
    timeline.add(Sample(0.0, gpus, {"vision": 2, "nlp": 1}, {"vision": 6}), shares)
    timeline.add(Sample(10.0, gpus, {"vision": 2, "nlp": 1}, {"vision": 6}), shares)
    accounts = timeline.accounts()
    assert accounts["vision"].owed == pytest.approx(40.0)
    assert accounts["vision"].delivered == pytest.approx(20.0)
    assert accounts["vision"].delivered_pct == pytest.approx(50.0)
    assert accounts["nlp"].delivered_pct == pytest.approx(100.0)
    assert timeline.span_s == 10.0


def test_the_window_slides_and_a_step_back_in_time_is_ignored() -> None:
    timeline = Timeline(window_s=100.0)
    full, empty = {"A100": Gpus(capacity=4, busy=4)}, {"A100": Gpus(capacity=4)}
    timeline.add(Sample(0.0, full, {"vision": 4}), {"vision": 1.0})
    timeline.add(Sample(50.0, empty), {"vision": 1.0})  # held 4 for 50 s, then nothing
    timeline.add(Sample(40.0, full, {"vision": 4}), {"vision": 1.0})  # ignored
    assert timeline.accounts()["vision"].delivered == pytest.approx(200.0)
    timeline.add(Sample(400.0, empty), {"vision": 1.0})
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
        "runs": "processes",
        "workflows_only": False,
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
    # The headline over the allocations shown: vision waits for all it is owed.
    assert [a["small"] for a in everyone["allocations"]] == [False, False]
    assert everyone["headline"]["owed_delivered_min_pct"] == 0.0
    assert everyone["headline"]["owed_small_teams"] == {
        "count": 0,
        "owed_pct": 0.0,
        "min_pct": None,
    }
    assert alice["headline"]["owed_delivered_weighted_pct"] == 0.0


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
        done.node_id = "n1"
    if ended:
        done.finished_at.FromNanoseconds(int(ended * 1e9))
    return done


def test_a_new_timeline_starts_from_the_jobs_history() -> None:
    """vision waits 100 s for 4 GPUs, runs them 200 s; nlp asks 8 from 200 s on, never
    placed. On 8 GPUs, vision (60 %) is owed 4 GPUs while it asks, nlp (40 %) 3.2."""
    jobs = [timed("v", "vision", 4, 100, 200, 400), timed("n", "nlp", 8, 200, 0, 0)]
    timeline = Timeline(window_s=1000)
    for past in history(jobs, [node("n1", 8)], since=0, now=500):
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
    nodes = [node("n1", 8)]
    assert history(jobs, nodes, since=100, now=200) == []
    samples = history([*jobs, timed("w", "vision", 2, 150, 0, 0)], nodes, since=100, now=200)
    assert [(s.at, dict(s.held), dict(s.asked), dict(s.by_type)) for s in samples] == [
        (150, {"vision": 4}, {"vision": 2}, {"A100": Gpus(capacity=8, busy=4)})
    ]


def test_gpus_serving_holds_are_held_for_their_allocation_busy_or_idle() -> None:
    workflow = job("w", "serving", 1, _S.JOB_STATE_RUNNING)
    n0 = node("n0", 4, running=(("w", 1),))  # its task runs on GPU 0
    n0.serving.add(gpu_index=0, allocation="serving")
    n0.serving.add(gpu_index=1, allocation="serving")  # the warm one
    got = sample(100.0, [n0], [workflow])
    assert got.total == Gpus(capacity=4, busy=2, idle=1, warm=1)
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


def page(
    nodes: list[types_pb2.Node], jobs: list[types_pb2.Job], scope: Scope | None = None
) -> dict[str, Any]:
    """The dashboard of one sample of ``nodes`` and ``jobs`` at time 10."""
    timeline = Timeline(window_s=1000.0)
    timeline.add(sample(10.0, nodes, jobs), {"vision": 0.5, "nlp": 0.5})
    return dashboard(
        user="alice" if scope else "carol",
        scope=scope,
        now=10.0,
        timeline=timeline,
        nodes=nodes,
        jobs=jobs,
        entitlements={"vision": 0.5, "nlp": 0.5},
    )


def test_occupancy_is_told_by_gpu_type_and_how_its_nodes_run_tasks() -> None:
    """The real H100s stand apart from the simulated T4s that serve workflows: the total
    alone (14 of 16, 87.5 %) would say neither 6 of 8 nor 8 of 8."""
    jobs = [job("a", "vision", 6, _S.JOB_STATE_RUNNING), job("w", "nlp", 8, _S.JOB_STATE_RUNNING)]
    real = node("h0", 8, "H100", running=(("a", 6),))
    serving = node("t0", 8, "T4", running=(("w", 8),))
    serving.inventory.executor = types_pb2.EXECUTOR_SIMULATED
    serving.inventory.workflows_only = True
    occupancy = page([real, serving], jobs)["occupancy"]
    assert occupancy["now"] == {"capacity": 16, "busy": 14, "idle": 0, "lost": 0}
    assert [(t["gpu_type"], t["runs"], t["now"]) for t in occupancy["types"]] == [
        ("H100", "processes", {"capacity": 8, "busy": 6, "idle": 0, "lost": 0}),
        ("T4", "simulated", {"capacity": 8, "busy": 8, "idle": 0, "lost": 0}),
    ]
    assert [(t["capacity"], t["busy"]) for t in occupancy["types"]] == [([8], [6]), ([8], [8])]
    listed = {n["node_id"]: (n["runs"], n["workflows_only"]) for n in page([serving], [])["nodes"]}
    assert listed == {"t0": ("simulated", True)}


def ended(job_id: str, state: int, *, user: str = "alice", exit_code: int = 0, at: float = 5.0,
          reason: str = "", stop_reason: str = "") -> types_pb2.Job:  # fmt: skip
    done = timed(job_id, "vision" if user == "alice" else "nlp", 1, 1.0, 2.0, at)
    done.state, done.exit_code = state, exit_code  # type: ignore[assignment]
    done.spec.user, done.reason, done.stop_reason = user, reason, stop_reason
    return done


def test_running_and_recently_ended_jobs_are_listed_within_the_users_scope() -> None:
    running = timed("r", "vision", 2, 1.0, 4.0, 0)
    gang = timed("g", "vision", 16, 1.0, 6.0, 0)
    gang.placements.add(task_id="g/0.0", node_id="h1", gpu_indices=range(8))
    gang.placements.add(task_id="g/0.1", node_id="h0", gpu_indices=range(8))
    jobs = [
        running,
        gang,
        timed("theirs", "nlp", 1, 1.0, 3.0, 0),
        ended("ok", _S.JOB_STATE_FINISHED, at=9.0),
        ended("bad", _S.JOB_STATE_FAILED, exit_code=3, reason="exit code 3", at=8.0),
        ended("nostart", _S.JOB_STATE_FAILED, reason="cannot run x: permission denied", at=7.0),
        ended("took", _S.JOB_STATE_PREEMPTED, stop_reason="free work yields", at=6.0),
        ended("late", _S.JOB_STATE_TIMEOUT, exit_code=143, reason="reached its time limit"),
        ended("bobs", _S.JOB_STATE_FINISHED, user="bob", at=9.5),
    ]
    jobs[2].spec.user = "bob"
    mine = page([node("n1", 8)], jobs, Scope("alice", frozenset({"vision"})))
    assert [(r["job_id"], r["nodes"], r["ran_s"]) for r in mine["running"]] == [
        ("g", ["h0", "h1"], 4.0),
        ("r", ["n1"], 6.0),
    ]
    assert [(e["job_id"], e["state"], e["exit_code"], e["reason"]) for e in mine["ended"]] == [
        ("ok", "finished", 0, ""),
        ("bad", "failed", 3, "exit code 3"),
        ("nostart", "failed", None, "cannot run x: permission denied"),
        ("took", "preempted", None, "free work yields"),
        ("late", "timeout", None, "reached its time limit"),  # not the signal's exit code
    ]
    assert (mine["ended"][0]["started_at"], mine["ended"][0]["finished_at"]) == (2.0, 9.0)
    everyone = page([node("n1", 8)], jobs)
    assert {r["job_id"] for r in everyone["running"]} == {"r", "g", "theirs"}
    assert everyone["ended"][0]["job_id"] == "bobs"


def test_only_the_latest_ended_jobs_are_listed_and_workflows_have_their_own_table() -> None:
    many = [ended(f"j{n:03}", _S.JOB_STATE_FINISHED, at=float(n)) for n in range(ENDED_SHOWN + 5)]
    flow = ended("flow", _S.JOB_STATE_FINISHED, at=1000.0)
    flow.spec.workflow.name = "caption"
    listed = [e["job_id"] for e in page([node("n1", 8)], [*many, flow])["ended"]]
    assert listed == [f"j{n:03}" for n in range(ENDED_SHOWN + 4, 4, -1)]
