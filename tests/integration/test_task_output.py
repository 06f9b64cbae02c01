"""A task's output and home on the real stack (the agent, as root in CI, runs tasks as
``nobody``): every attempt of a requeued job and every part of a gang keeps a log of its
own that ``qm logs`` shows in order under its header; a task starts in its job's
scratch folder, kept across the job's attempts and removed once it ends; stdout and
stderr reach the log in whole lines, and Python's as it prints."""

from __future__ import annotations

import shlex
import subprocess
import sys

from google.protobuf.duration_pb2 import Duration
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import cluster_service_pb2_grpc, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from tests.integration.conftest import eventually, until_running, wait_for_end
from tests.integration.stack import ROOT, Stack
from tests.integration.test_job_lifecycle import submit
from tests.integration.test_logs import qm, qm_env
from tests.integration.test_steering import job

# Counts its runs in its working directory; the third one ends.
RESUMES = """
import os, sys, time
runs = int(open("runs").read()) + 1 if os.path.exists("runs") else 1
open("runs", "w").write(str(runs))
print("run", runs, "in", os.getcwd())
print("warning", runs, file=sys.stderr)
if runs < 3:
    time.sleep(600)
"""


def running_again(
    stack: Stack, jobs: js_grpc.JobServiceStub, job_id: str, attempts: int
) -> types_pb2.Job:
    """The job once its ``attempts``-th attempt runs."""

    def running() -> types_pb2.Job | None:
        found = job(stack, jobs, job_id)
        ready = found.state == types_pb2.JOB_STATE_RUNNING and found.attempts == attempts
        return found if ready else None

    return eventually(running, what=f"attempt {attempts} of {job_id} to run")


def headers(shown: str) -> list[str]:
    return [line for line in shown.splitlines() if line.startswith("=== ")]


def test_a_drained_then_preempted_jobs_attempts_and_a_gangs_parts_each_show_in_qm_logs(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    """Attempt 1 is drained, attempt 2 preempted by a charged gang over both process
    nodes, attempt 3 finishes: each starts (no log of an earlier attempt in its way),
    finds the file the one before it left in its working directory, and shows in
    ``qm logs``, followed or not; the gang's two parts show too."""
    cluster = cluster_service_pb2_grpc.ClusterServiceStub(stack.channel())
    resumes = submit(
        stack, jobs, gpus=4, gpu_type="H100", resumable=True, command=["python3", "-c", RESUMES]
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "cli", "logs", "-f", resumes],
        cwd=ROOT,
        env=qm_env(stack, "alice"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = until_running(stack, jobs, resumes).node_id
        drain = cs.CordonNodeRequest(node_id=first, drain=True)
        cluster.CordonNode(drain, metadata=stack.auth("carol"))
        try:
            second = running_again(stack, jobs, resumes, attempts=2).node_id
        finally:
            uncordon = cs.UncordonNodeRequest(node_id=first)
            cluster.UncordonNode(uncordon, metadata=stack.auth("carol"))
        gang = submit(
            stack,
            jobs,
            gpus=8,
            nodes=2,
            gpu_type="H100",
            min_runtime=Duration(seconds=60),
            command=["python3", "-c", "import os; print('part', os.environ['QM_TASK_ID'])"],
        )
        assert wait_for_end(stack, jobs, gang).state == types_pb2.JOB_STATE_FINISHED
        ended = wait_for_end(stack, jobs, resumes)
        followed, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert (ended.state, ended.attempts) == (types_pb2.JOB_STATE_FINISHED, 3), ended
    shown = qm(stack, "alice", "logs", resumes)
    assert shown.returncode == 0, shown.stderr
    assert headers(shown.stdout) == [
        f"=== attempt 1 ({resumes}/0) on {first} ===",
        f"=== attempt 2 ({resumes}/1) on {second} ===",
        f"=== attempt 3 ({resumes}/2) on {ended.node_id} ===",
    ]
    home = stack.scratch / resumes
    runs = [line for line in shown.stdout.splitlines() if line.startswith("run ")]
    assert runs == [f"run {n} in {home}" for n in (1, 2, 3)]
    assert [line for line in shown.stdout.splitlines() if line.startswith("warning")] == [
        "warning 1", "warning 2", "warning 3",
    ]  # fmt: skip
    assert followed == shown.stdout, "following shows the same, across both requeues"
    second_only = qm(stack, "alice", "logs", resumes, "--attempt", "2").stdout
    assert headers(second_only) == [f"=== attempt 2 ({resumes}/1) on {second} ==="]
    assert f"run 2 in {home}" in second_only and "run 1" not in second_only

    # The job reads FINISHED once a part has: the other may be printing still.
    def both_parts() -> str | None:
        shown = qm(stack, "alice", "logs", gang).stdout
        printed = [line for line in shown.splitlines() if line.startswith("part ")]
        return shown if printed == [f"part {gang}/0.0", f"part {gang}/0.1"] else None

    parts = eventually(both_parts, what=f"both parts of {gang} in qm logs")
    placements = job(stack, jobs, gang).placements
    assert headers(parts) == [
        f"=== attempt 1, part {rank + 1} ({p.task_id}) on {p.node_id} ==="
        for rank, p in enumerate(placements)
    ]
    # Both jobs have ended: their scratch folders are gone.
    eventually(lambda: not home.exists() and not (stack.scratch / gang).exists())


def test_stdout_and_stderr_arrive_in_whole_lines_and_python_as_it_prints(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    """Half a stdout line, a stderr line, the rest of the stdout line: the stderr line
    goes before, not inside. Python prints without flushing and sleeps: its line reaches
    ``qm logs -f`` while it runs."""
    script = (
        "import sys, time\n"
        "sys.stdout.write('half '); sys.stdout.flush(); time.sleep(0.1)\n"
        "print('an error', file=sys.stderr); time.sleep(0.1)\n"
        "print('whole')\n"
        "print('ready')\n"
        "time.sleep(600)\n"
    )
    job_id = submit(stack, jobs, gpus=1, gpu_type="H100", command=["python3", "-c", script])
    request = js.StreamLogsRequest(job_id=job_id, follow=True)
    pieces = jobs.StreamLogs(request, metadata=stack.auth("alice"), timeout=60)
    seen = b""
    for piece in pieces:
        seen += piece.data
        if b"ready\n" in seen:
            break
    assert job(stack, jobs, job_id).state == types_pb2.JOB_STATE_RUNNING
    jobs.CancelJob(js.CancelJobRequest(job_id=job_id), metadata=stack.auth("alice"))
    seen += b"".join(piece.data for piece in pieces)
    assert seen.decode().splitlines()[1:] == ["an error", "half whole", "ready"]


def test_the_readmes_array_example_works_as_written(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    """Each element writes into its working directory (its own scratch folder) and
    prints."""
    line = next(
        line.strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("qm submit --array")
    )
    args = shlex.split(line, comments=True)[1:]
    submitted = qm(stack, "bob", *args)  # bob has one allocation: the README names none
    assert submitted.returncode == 0, submitted.stderr
    array_id = submitted.stdout.split()[2].rstrip(":")  # submitted array a-…: 10 jobs, …
    assert submitted.stdout.startswith(f"submitted array {array_id}: 10 jobs, {array_id}_0 …")
    for index, job_id in enumerate(f"{array_id}_{i}" for i in range(10)):
        request = js.GetJobRequest(job_id=job_id)
        wait_for_end(stack, jobs, job_id)
        ended = jobs.GetJob(request, metadata=stack.auth("bob")).job
        assert ended.state == types_pb2.JOB_STATE_FINISHED, ended
        shown = qm(stack, "bob", "logs", job_id).stdout
        assert f"index {index} wrote out.txt in {stack.scratch / job_id}" in shown.splitlines()
