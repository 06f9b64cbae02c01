"""``qm`` for scripts against the real stack: list filters applied by admission within the
caller's scope, and ``qm export`` of real history replayed by the simulator (a job still
running left out, saying so)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli.app import app
from libs.auth import issue_token
from libs.core import simulated
from libs.sim.traces import load_event_log
from tests.integration.conftest import until_running, wait_for_end
from tests.integration.stack import Stack

S = types_pb2.JobState


def submit(
    stack: Stack, jobs: js_grpc.JobServiceStub, user: str, allocation: str, gpus: int, run_s: float
) -> str:
    spec = types_pb2.JobSpec(
        allocation=allocation,
        gpus=gpus,
        gpu_type="A100",  # the simulated node: a run takes QM_SIMULATED_SECONDS
        command=["train"],
        env={simulated.SECONDS: str(run_s)},
    )
    reply = jobs.SubmitJob(js.SubmitJobRequest(spec=spec), metadata=stack.auth(user), timeout=30)
    return str(reply.job_id)


def qm(stack: Stack, user: str, *args: str) -> str:
    env = {
        **stack.env,
        "QM_ADDR": f"127.0.0.1:{stack.admission_port}",
        "QM_TOKEN": issue_token(user, stack.signer),
        "QM_TLS_CA": "",
    }
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def listed(stack: Stack, jobs: js_grpc.JobServiceStub, caller: str, **where: object) -> set[str]:
    """The ids of the jobs ``caller`` is shown for ListJobs(``where``)."""
    request = js.ListJobsRequest(limit=1000, **where)  # type: ignore[arg-type]
    reply = jobs.ListJobs(request, metadata=stack.auth(caller), timeout=30)
    return {job.job_id for job in reply.jobs}


def test_filters_pick_within_what_the_caller_may_see(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    alice_vision = submit(stack, jobs, "alice", "vision", 1, 0.2)
    alice_nlp = submit(stack, jobs, "alice", "nlp", 1, 0.2)
    bob_nlp = submit(stack, jobs, "bob", "nlp", 1, 0.2)
    for job_id in (alice_vision, alice_nlp, bob_nlp):
        wait_for_end(stack, jobs, job_id)
    running = submit(stack, jobs, "alice", "vision", 1, 600)
    until_running(stack, jobs, running)
    try:
        by_alice = listed(stack, jobs, "bob", user="alice")
        # bob (of nlp) asks for alice's jobs: her nlp job, never her vision ones.
        assert alice_nlp in by_alice and not {alice_vision, running} & by_alice
        assert bob_nlp in listed(stack, jobs, "alice", user="bob")  # alice is in nlp too
        finished = listed(stack, jobs, "alice", user="alice", states=[S.JOB_STATE_FINISHED])
        assert {alice_vision, alice_nlp} <= finished and running not in finished
        assert listed(stack, jobs, "alice", allocation="vision", user="bob") == set()
        document = json.loads(
            qm(
                stack,
                "dana",
                "status",
                "--user",
                "alice",
                "--state",
                "finished,running",
                "-o",
                "json",
            )
        )
        # dana manages vision: alice's vision jobs, in the states asked for.
        shown = {job["job_id"]: job for job in document["jobs"]}
        assert alice_vision in shown and alice_nlp not in shown
        assert {job["state"] for job in shown.values()} <= {
            "JOB_STATE_FINISHED",
            "JOB_STATE_RUNNING",
        }
        assert shown[alice_vision]["spec"]["user"] == "alice"
        assert shown[running]["state"] == "JOB_STATE_RUNNING"
        with pytest.raises(grpc.RpcError) as refused:
            listed(stack, jobs, "alice", states=[S.JOB_STATE_UNSPECIFIED])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "JOB_STATE_RUNNING" in refused.value.details()
    finally:
        jobs.CancelJob(
            js.CancelJobRequest(job_id=running), metadata=stack.auth("alice"), timeout=30
        )


def test_an_export_of_real_history_replays_under_two_policies(
    stack: Stack, jobs: js_grpc.JobServiceStub, tmp_path: Path
) -> None:
    since = datetime.now(UTC).isoformat()
    wanted = {
        submit(stack, jobs, "alice", "vision", 2, 1.0): ("alice", "vision", 2),
        submit(stack, jobs, "bob", "nlp", 4, 0.5): ("bob", "nlp", 4),
        submit(stack, jobs, "alice", "nlp", 1, 1.5): ("alice", "nlp", 1),
    }
    ended = {job_id: wait_for_end(stack, jobs, job_id) for job_id in wanted}
    assert all(job.state == S.JOB_STATE_FINISHED for job in ended.values())
    # A process that runs on: its run has no end to replay yet.
    spec = types_pb2.JobSpec(allocation="vision", gpus=1, gpu_type="H100", command=["sleep", "600"])
    running = jobs.SubmitJob(
        js.SubmitJobRequest(spec=spec), metadata=stack.auth("alice"), timeout=30
    ).job_id
    until_running(stack, jobs, running)
    out = tmp_path / "history.qmlog"
    env = {**stack.env, **stack.principal_env("auditor")}  # reads the log as the auditor
    try:
        exported = CliRunner().invoke(app, ["export", "--since", since, "--out", str(out)], env=env)
    finally:
        jobs.CancelJob(
            js.CancelJobRequest(job_id=running), metadata=stack.auth("alice"), timeout=30
        )
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == ""  # what it says goes to stderr
    assert "replay them with: qm sim run --trace eventlog" in exported.stderr

    log = load_event_log(out)
    got = {job.job_id: job for job in log.jobs}
    assert got.keys() == wanted.keys()  # only the window's jobs, every one of them
    for job_id, (user, allocation, gpus) in wanted.items():
        job, real = got[job_id], ended[job_id]
        assert (job.spec.user, job.spec.allocation, job.spec.gpus) == (user, allocation, gpus)
        assert job.at == pytest.approx(real.submitted_at.ToNanoseconds() / 1e9, abs=1)
        assert job.runtime_s == float(real.spec.env[simulated.SECONDS])
    assert {node.node_id for node in log.nodes} == {"proc-0", "proc-1", "sim-0"}
    assert log.tree is not None and set(log.tree.leaves()) == {"vision", "nlp"}

    replay = tmp_path / "replay"
    for policy in ("fifo", "budget"):
        flags = ["--trace", "eventlog", "--trace-path", str(out), "--policy", policy]
        args = [*flags, "--no-plots", "--out", str(replay / policy), "-o", "json"]
        report = json.loads(qm(stack, "alice", "sim", "run", *args))
        assert (report["jobs"], report["gpus"], report["nodes"]) == (3, 16, 3)
        assert report["left_out"] == [{"job_id": running, "why": "still running when the log ends"}]
        (summary,) = report["tables"]
        assert [row["policy"] for row in summary["rows"]] == [policy]
        metrics = json.loads((replay / policy / "metrics.json").read_text())
        teams = metrics["workload"]["teams"]
        assert (teams["vision"]["jobs"], teams["nlp"]["jobs"]) == (1, 2)
        assert sum(metrics["policies"][policy]["jobs"].values()) == 3, metrics["policies"]
