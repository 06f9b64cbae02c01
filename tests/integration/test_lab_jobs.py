"""A lab's real jobs on the real stack, through ``qm`` as a researcher types it: a job
in an image with a declared volume, a two-node job whose parts rendezvous at rank 0
(nodes at distinct addresses, 127.0.0.2 and 127.0.0.3), a gang that dies as one, a
time limit, a chain of dependencies, a job array taken whole or one element at a time,
``--wait`` exiting with the job's own code, and a preempted job warned ahead that
resumes from its checkpoint."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time

import pytest
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.config.sandbox import ContainersEntry
from services.node_agent.containers import Storage
from services.node_agent.images import DEFAULT_ROOT
from tests.integration.conftest import until_running, wait_for_end
from tests.integration.stack import ROOT, Stack
from tests.integration.test_logs import qm
from tests.integration.test_steering import job

RENDEZVOUS = (ROOT / "deploy" / "examples" / "rendezvous.py").read_text()
GRACE_S = 10  # the node agent's own (--grace-seconds)
TIMEOUT_EXIT = 124  # qm submit --wait's exit code for a job that timed out


def submitted(stack: Stack, *args: str) -> str:
    """Submit as alice (vision) and return the job id ``qm submit`` prints."""
    done = qm(stack, "alice", "submit", "--allocation", "vision", "--quiet", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def state(found: types_pb2.Job) -> str:
    return types_pb2.JobState.Name(found.state)


def test_a_two_node_job_rendezvouses_at_rank_0_and_sums_a_number_from_every_part(
    stack: Stack,
) -> None:
    waited = qm(
        stack, "alice", "submit", "--allocation", "vision", "--nodes", "2",
        "--gpus-per-node", "2", "--gpu-type", "H100", "--wait", "--quiet",
        "--", "python3", "-c", RENDEZVOUS,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stdout + waited.stderr
    job_id = waited.stdout.strip()
    shown = qm(stack, "alice", "logs", job_id).stdout
    assert "rank 0 of 2: sum = 3" in shown and "rank 1 of 2: sum = 3" in shown, shown


def test_a_part_that_exits_3_fails_the_gang_within_the_grace_naming_its_rank(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    rank_1_fails = (
        "import os, sys, time\nif os.environ['QM_NODE_RANK'] == '1': sys.exit(3)\ntime.sleep(600)\n"
    )
    job_id = submitted(
        stack, "--nodes", "2", "--gpus-per-node", "1", "--gpu-type", "H100",
        "--", "python3", "-c", rank_1_fails,
    )  # fmt: skip
    ended = wait_for_end(stack, jobs, job_id)
    assert state(ended) == "JOB_STATE_FAILED", ended
    assert ended.exit_code == 3 and "rank 1 exited with code 3" in ended.reason, ended
    failed_at = max(p.finished_at.ToNanoseconds() for p in ended.placements if p.exit_code == 3)
    assert ended.finished_at.ToNanoseconds() - failed_at <= (GRACE_S + 5) * 10**9


def test_a_time_limit_ends_the_job_timeout_within_the_grace(stack: Stack) -> None:
    began = time.monotonic()
    waited = qm(
        stack, "alice", "submit", "--allocation", "vision", "--time", "5s",
        "--gpu-type", "H100", "--wait", "--", "sleep", "60",
    )  # fmt: skip
    took = time.monotonic() - began
    assert waited.returncode == TIMEOUT_EXIT, waited.stdout + waited.stderr
    assert "TIMEOUT" in waited.stdout + waited.stderr
    assert took <= 5 + GRACE_S + 5 + 5  # and the job's start


def test_wait_exits_with_the_jobs_own_exit_code(stack: Stack) -> None:
    waited = qm(
        stack, "alice", "submit", "--allocation", "vision", "--gpu-type", "H100", "--wait",
        "--", "python3", "-c", "import sys; sys.exit(3)",
    )  # fmt: skip
    assert waited.returncode == 3, waited.stdout + waited.stderr


def test_a_chain_of_dependencies_runs_in_order_and_a_failed_one_cancels_its_dependent(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    prep = submitted(stack, "--", "python3", "-c", "import time; time.sleep(2)")
    train = submitted(stack, "--after", prep, "--", "python3", "-c", "print('trained')")
    broken = submitted(stack, "--", "python3", "-c", "import sys; sys.exit(1)")
    report = submitted(stack, "--after", f"{broken}:ok", "--", "true")
    cleanup = submitted(stack, "--after", f"{report}:any", "--", "true")
    why = qm(stack, "alice", "why", train).stdout
    assert f"waits for {prep}" in why or state(job(stack, jobs, train)) != "JOB_STATE_PENDING"

    ended = {j: wait_for_end(stack, jobs, j) for j in (prep, train, broken, report, cleanup)}
    assert [state(ended[j]) for j in (prep, train, broken, report, cleanup)] == [
        "JOB_STATE_FINISHED",
        "JOB_STATE_FINISHED",
        "JOB_STATE_FAILED",
        "JOB_STATE_CANCELLED",
        "JOB_STATE_FINISHED",
    ]
    after_prep = ended[train].started_at.ToNanoseconds() >= ended[prep].finished_at.ToNanoseconds()
    assert after_prep, (ended[prep], ended[train])
    assert f"dependency {broken} failed" in ended[report].reason, ended[report]


# Elements 0 and 1 end at once; 2 and 3 run until cancelled.
ELEMENT = """
import os, time
index = int(os.environ["QM_ARRAY_INDEX"])
print("element", index, "of", os.environ["QM_ARRAY_ID"], os.environ["QM_ARRAY_COUNT"], flush=True)
time.sleep(0 if index < 2 else 600)
"""


def test_an_array_is_one_id_and_status_and_cancel_take_it_whole_or_one_element(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    args = ("--array", "0-3", "--request-id", "sweep-1", "--", "python3", "-c", ELEMENT)
    array_id = submitted(stack, *args)
    assert array_id.startswith("a-") and submitted(stack, *args) == array_id  # a retry: the same
    elements = [f"{array_id}_{i}" for i in range(4)]
    for element in elements[2:]:
        until_running(stack, jobs, element)
    for index, element in enumerate(elements[:2]):
        assert state(wait_for_end(stack, jobs, element)) == "JOB_STATE_FINISHED"
        shown = qm(stack, "alice", "logs", element).stdout
        assert f"element {index} of {array_id} 4" in shown, shown

    one = qm(stack, "alice", "cancel", elements[3])
    assert one.returncode == 0, one.stderr
    assert state(wait_for_end(stack, jobs, elements[3])) == "JOB_STATE_CANCELLED"
    listed = qm(stack, "alice", "status", array_id)
    assert listed.returncode == 0, listed.stderr
    heading = f"array {array_id}: 4 elements: 1 CANCELLED, 2 FINISHED, 1 RUNNING"
    assert listed.stdout.splitlines()[0] == heading, listed.stdout
    detail = qm(stack, "alice", "status", elements[2]).stdout
    assert f"{array_id}, element 2 of 4" in detail and "RUNNING" in detail, detail

    # A second array waits for element 2: held and released whole, cancelled with it.
    waiting = submitted(stack, "--array", "0-1", "--after", elements[2], "--", "true")
    held = qm(stack, "alice", "hold", waiting)
    assert f"held 2 elements of {waiting}: {waiting}_0 {waiting}_1" in held.stdout, held
    released = qm(stack, "alice", "release", waiting)
    assert f"released 2 elements of {waiting}" in released.stdout, released

    whole = qm(stack, "alice", "cancel", array_id)
    assert whole.returncode == 0, whole.stderr
    assert f"cancel requested for 1 element of {array_id}: {elements[2]}" in whole.stdout
    assert state(wait_for_end(stack, jobs, elements[2])) == "JOB_STATE_CANCELLED"
    for element in (f"{waiting}_0", f"{waiting}_1"):
        assert state(wait_for_end(stack, jobs, element)) == "JOB_STATE_CANCELLED"
    again = qm(stack, "alice", "cancel", array_id)
    assert again.returncode != 0 and "all have ended" in again.stderr, again.stderr
    # One job waits for the whole array: it starts once every element has ended.
    after = submitted(stack, "--after", f"{array_id}:any", "--", "true")
    assert f"{array_id} (4 elements):any" in qm(stack, "alice", "status", after).stdout
    assert state(wait_for_end(stack, jobs, after)) == "JOB_STATE_FINISHED"


# Attempt 0 keeps a checkpoint on USR1 (without saying so: its warning runs out) and says
# when USR1 and SIGTERM came; attempt 1 shows what attempt 0 kept.
CHECKPOINTED = """
import os, signal, sys, time
kept = os.path.join(os.environ["QM_CHECKPOINT_DIR"], "step")
print("restart", os.environ["QM_RESTART_COUNT"], flush=True)
if os.path.exists(kept):
    print("resumed from", open(kept).read(), flush=True)
    sys.exit(0)
def usr1(signum, frame):
    open(kept, "w").write("step-41")
    print("usr1", time.monotonic(), flush=True)
def term(signum, frame):
    print("term", time.monotonic(), flush=True)
    sys.exit(143)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_preempted_job_is_warned_its_time_ahead_and_resumes_from_its_checkpoint(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    warned = submitted(
        stack, "--gpus", "4", "--gpu-type", "H100", "--resumable", "--signal", "USR1@20s",
        "--", "python3", "-c", CHECKPOINTED,
    )  # fmt: skip
    until_running(stack, jobs, warned)
    # The other process node busy with free work too, then charged work that needs one.
    filler = submitted(stack, "--gpus", "4", "--gpu-type", "H100", "--", "sleep", "600")
    try:
        until_running(stack, jobs, filler)
        charged = submitted(
            stack, "--gpus", "4", "--gpu-type", "H100", "--min-runtime", "1m",
            "--", "sleep", "1",
        )  # fmt: skip
        ended = wait_for_end(stack, jobs, warned)
    finally:
        qm(stack, "alice", "cancel", filler)
    assert state(ended) == "JOB_STATE_FINISHED" and ended.attempts == 2, ended
    assert state(wait_for_end(stack, jobs, charged)) == "JOB_STATE_FINISHED"
    shown = qm(stack, "alice", "logs", warned).stdout
    times = dict(line.split()[:2] for line in shown.splitlines() if line[:4] in ("usr1", "term"))
    assert float(times["term"]) - float(times["usr1"]) >= 19.9, shown
    assert "restart 1" in shown and "resumed from step-41" in shown, shown


EXAMPLE_IMAGE = "localhost/qm-example:1"


def example_image_missing() -> str:
    """Why the image test cannot run here ("" when it can)."""
    if os.geteuid() != 0 or shutil.which("podman") is None:
        return "podman as root is not here (.ci/run installs it)"
    storage = Storage.of(ContainersEntry(), DEFAULT_ROOT)
    found = subprocess.run(
        ["podman", *storage.flags(), "image", "exists", EXAMPLE_IMAGE],
        cwd=ROOT, env=storage.environment(os.environ["PATH"]), capture_output=True,
    )  # fmt: skip
    return "" if found.returncode == 0 else f"no {EXAMPLE_IMAGE}: make example-image"


@pytest.mark.skipif(bool(example_image_missing()), reason=example_image_missing())
def test_a_job_in_an_image_runs_as_its_account_with_its_mounts_and_only_those(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    script = (
        "echo 42; id -u; ls /dev | grep -c nvidia; cat /data/hello; "
        "touch /data/mine 2>/dev/null || echo read-only; pwd"
    )
    waited = qm(
        stack, "alice", "submit", "--allocation", "vision", "--image", EXAMPLE_IMAGE,
        "--mount", "datasets:/data", "--gpu-type", "H100", "--wait", "--quiet",
        "--", "sh", "-c", script,
    )  # fmt: skip
    job_id = waited.stdout.strip()
    shown = qm(stack, "alice", "logs", job_id).stdout.splitlines()
    assert waited.returncode == 0, shown
    nobody = str(pwd.getpwnam("nobody").pw_uid)
    # 42, as nobody (alice's tasks' account here), no GPU device of another task (none
    # here: the machine has none), the dataset read but not written, in its scratch folder.
    assert shown[-6:-1] == ["42", nobody, "0", "hello from the dataset", "read-only"], shown
    assert shown[-1].startswith(str(stack.scratch)), shown
    undeclared = submitted(
        stack, "--image", EXAMPLE_IMAGE, "--mount", "secrets:/x", "--gpu-type", "H100",
        "--", "true",
    )  # fmt: skip
    refused = wait_for_end(stack, jobs, undeclared)
    assert state(refused) == "JOB_STATE_FAILED", refused
    assert "mount: no volume secrets here; declared: datasets" in refused.reason, refused


# Two minutes of work that says how far it got, and which attempt it is.
TWO_MINUTES = """
import os, time
print("restart", os.environ["QM_RESTART_COUNT"], flush=True)
for second in range(120):
    print("second", second, flush=True)
    time.sleep(1)
print("done", flush=True)
"""


@pytest.mark.timeout(300)  # a two-minute job
def test_an_agent_killed_and_restarted_while_a_job_runs_stops_nothing(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submitted(stack, "--gpu-type", "H100", "--", "python3", "-c", TWO_MINUTES)
    until_running(stack, jobs, job_id)
    time.sleep(3)
    stack.kill("node_agent")  # -9: no goodbye
    stack.start_node_agent()
    ended = wait_for_end(stack, jobs, job_id, timeout=240)
    assert (state(ended), ended.exit_code, ended.attempts) == ("JOB_STATE_FINISHED", 0, 1), ended
    shown = qm(stack, "alice", "logs", job_id).stdout.splitlines()
    # One attempt, every second of it in its log, the agent's restart in the middle.
    assert "restart 0" in shown and shown[-1] == "done", shown
    assert [line for line in shown if line.startswith("second")] == [
        f"second {s}" for s in range(120)
    ]
