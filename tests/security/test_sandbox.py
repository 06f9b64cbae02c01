"""Attacks from inside a task: it runs as its user's unprivileged account, with a clean
environment, so the agent's credentials, its environment, the secret store and other
users' task logs are out of reach; a task gets its own user's secrets only. Each refusal
is paired with what the same task may do, so that a refusal is the sandbox's, not a
broken command. Switching accounts needs a root agent (as in CI); elsewhere those tests
say so and skip."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.config.document import ConfigError, validate
from libs.config.sandbox import SandboxFile, ScratchEntry
from services.node_agent import privileges
from services.node_agent.executors import ProcessExecutor
from services.node_agent.launch import LaunchError
from services.node_agent.sandbox import Sandbox
from services.node_agent.secrets import SecretStore
from services.node_agent.tasklogs import TaskLogs

NOBODY = 65534
OTHER = 65533  # a second unprivileged uid, without a passwd entry
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching a task's account needs a root node agent"
)


def task(job_id: str, user: str, *command: str) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id=job_id, task_id=f"{job_id}/0", node_id="n", gpu_indices=[0],
        spec=types_pb2.JobSpec(user=user, command=command),
    )  # fmt: skip


def executor(folder: Path, *, switch: bool) -> ProcessExecutor:
    """Task logs in ``folder/logs``, scratch folders in ``folder/scratch``."""
    config = SandboxFile(users={"alice": NOBODY, "bob": OTHER}, default=None)
    return runs_in(folder, config, os.environ, switch=switch)


def runs_in(
    folder: Path, config: SandboxFile, env: Mapping[str, str], *, switch: bool, **options: Any
) -> ProcessExecutor:
    config = config.model_copy(update={"scratch": ScratchEntry(root=str(folder / "scratch"))})
    sandbox = Sandbox(config, env, switch=switch)
    return ProcessExecutor(TaskLogs(folder / "logs"), sandbox=sandbox, **options)


def log_of(folder: Path, job: events_pb2.TaskPlaced) -> Path:
    return TaskLogs(folder / "logs").path(job.job_id, job.task_id)


async def run(runner: ProcessExecutor, logs: Path, job: events_pb2.TaskPlaced) -> tuple[int, str]:
    """Start the task, wait for it to end, let go of its job's folder as the agent does."""
    execution = await runner.start(job)
    code = await execution.wait()
    execution.cleanup(may_return=False)
    await runner.close()  # the folder's removal runs in the background: until it is done
    return code, log_of(logs, job).read_text().split("\n", 1)[1]


async def test_a_task_sees_none_of_the_agents_environment(tmp_path: Path) -> None:
    agent_env = {
        "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "QM_AUTH_SIGNING_KEY_FILE": "/etc/qm/key",
        "QM_KAFKA_SASL_PASSWORD": "bus-password", "AWS_SECRET_ACCESS_KEY": "cloud",
    }  # fmt: skip
    runner = runs_in(tmp_path, SandboxFile(), agent_env, switch=False)
    code, output = await run(runner, tmp_path, task("env", "alice", "env"))
    seen = dict(line.split("=", 1) for line in output.splitlines())
    assert code == 0
    assert set(seen) == {
        "PATH", "LANG", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "QM_JOB_ID", "QM_TASK_ID",
        "HOME", "TMPDIR", "PYTHONUNBUFFERED", "QM_RESTART_COUNT", "QM_NUM_NODES", "QM_NODE_RANK",
        "QM_GPUS_PER_NODE", "QM_HOSTS", "QM_CHECKPOINT_SAVED",
    }  # fmt: skip


@as_root
async def test_a_task_runs_as_its_users_account_in_its_own_process_group(shared: Path) -> None:
    code, output = await run(
        executor(shared, switch=True), shared,
        task("who", "alice", "sh", "-c", "id -u; id -G; ps -o pgid= -p $$; echo $$"),
    )  # fmt: skip
    uid, groups, pgid, pid = output.split()
    assert (code, uid, groups) == (0, str(NOBODY), str(grp.getgrnam("nogroup").gr_gid))
    assert pgid == pid


@as_root
async def test_a_task_as_its_account_may_reopen_its_own_output(shared: Path) -> None:
    """Programs log to /dev/stdout and /dev/stderr by name: the pipe is the task's."""
    script = "echo to-stdout > /dev/stdout; echo to-stderr > /dev/stderr"
    code, output = await run(
        executor(shared, switch=True), shared, task("reopen", "alice", "sh", "-c", script)
    )
    assert (code, output.split()) == (0, ["to-stdout", "to-stderr"])


@as_root
async def test_a_task_cannot_read_the_agents_secret_files(shared: Path) -> None:
    secret, public = shared / "auth-secret", shared / "public"
    secret.write_text("signing-key")
    secret.chmod(0o600)  # as the local stack keeps its secrets
    public.write_text("hello")
    public.chmod(0o644)
    code, output = await run(
        executor(shared, switch=True), shared, task("steal", "alice", "cat", str(secret))
    )
    assert code != 0 and "Permission denied" in output and "signing-key" not in output
    code, output = await run(
        executor(shared, switch=True), shared, task("read", "alice", "cat", str(public))
    )
    assert (code, output.strip()) == (0, "hello")


@as_root
async def test_a_task_cannot_read_the_agents_environment_in_proc(shared: Path) -> None:
    steal = task("proc", "alice", "cat", f"/proc/{os.getpid()}/environ")
    code, output = await run(executor(shared, switch=True), shared, steal)
    assert code != 0 and "Permission denied" in output
    own = task("own", "alice", "sh", "-c", "cat /proc/self/environ | tr '\\0' '\\n' | grep QM_JOB")
    assert await run(executor(shared, switch=True), shared, own) == (0, "QM_JOB_ID=own\n")


@as_root
async def test_no_task_reads_a_task_log_not_even_its_own(shared: Path) -> None:
    """Each log is its task's account's, in folders only the agent enters: the next task,
    of another account or of the same one, reads none."""
    runner = executor(shared, switch=True)
    written = task("alice-job", "alice", "echo", "alice's results")
    code, _ = await run(runner, shared, written)
    assert code == 0
    log = log_of(shared, written)
    assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (NOBODY, 0o600)
    for folder in (log.parent, log.parent.parent):
        assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (0, 0o700)
    for job_id, user in (("bob-job", "bob"), ("alice-2", "alice")):
        code, output = await run(runner, shared, task(job_id, user, "cat", str(log)))
        assert code != 0 and "Permission denied" in output and "results" not in output


@as_root
async def test_a_task_without_a_home_runs_in_its_jobs_scratch_folder_with_a_path_it_can_use(
    shared: Path, tmp_path: Path
) -> None:
    """nobody has no home: its task starts in its job's scratch folder (its own, 0700),
    there as HOME and TMPDIR, and finds in PATH only folders it may enter (not root's)."""
    private = tmp_path / "bin"  # under pytest's folder, which only root enters
    private.mkdir()
    config = SandboxFile(default=NOBODY)
    runner = runs_in(shared, config, {"PATH": f"{private}:/usr/bin:/bin"}, switch=True)
    script = (
        'echo "$PATH"; pwd; echo "$HOME $TMPDIR"; mkdir -p ro/x && chmod 500 ro && stat -c %u:%a .'
    )
    code, output = await run(runner, shared, task("home", "alice", "sh", "-c", script))
    scratch = shared / "scratch" / "home"
    assert code == 0
    assert output.splitlines() == [
        "/usr/bin:/bin",
        str(scratch),
        f"{scratch} {scratch}",
        f"{NOBODY}:700",
    ]
    assert not scratch.exists(), "its job ended: its folder, read-only parts too, is removed"


@as_root
async def test_a_user_without_an_account_here_is_refused(shared: Path) -> None:
    with pytest.raises(LaunchError, match="user 'mallory' has no local account on this node"):
        await executor(shared, switch=True).start(task("m", "mallory", "true"))


@pytest.mark.parametrize("raw", [{"default": "root"}, {"users": {"eve": "root"}}, {"default": 0}])
def test_no_sandbox_file_runs_tasks_as_root(raw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"never run as root|expected a number >= 1"):
        validate(SandboxFile, raw, "sandbox.yaml")


@pytest.fixture
def store(shared: Path) -> SecretStore:
    """The node's store as the agent keeps it: a folder only root enters."""
    root = shared / "secrets"
    for user, value in (("alice", "alice-wandb-key"), ("bob", "bob-wandb-key")):
        (root / user).mkdir(parents=True)
        (root / user / "WANDB_API_KEY").write_text(value + "\n")
    root.chmod(0o700)
    return SecretStore(root)


def secret_task(job_id: str, user: str, *command: str) -> events_pb2.TaskPlaced:
    placed = task(job_id, user, *command)
    placed.spec.secrets.append("WANDB_API_KEY")
    return placed


async def test_a_task_gets_its_users_secret_and_no_one_elses(
    shared: Path, store: SecretStore
) -> None:
    """The job names the secret; the agent reads the value for the job's own user."""
    runner = runs_in(shared, SandboxFile(), os.environ, switch=False, secrets=store)
    show = ("sh", "-c", "echo $WANDB_API_KEY")
    assert await run(runner, shared, secret_task("a", "alice", *show)) == (0, "alice-wandb-key\n")
    assert await run(runner, shared, secret_task("b", "bob", *show)) == (0, "bob-wandb-key\n")
    with pytest.raises(LaunchError, match="secret WANDB_API_KEY of carol is not in"):
        await runner.start(secret_task("c", "carol", *show))
    with pytest.raises(LaunchError, match=r"no secrets for user '\.\./alice'"):
        await runner.start(secret_task("d", "../alice", *show))


@as_root
async def test_a_task_cannot_read_the_secret_store(shared: Path, store: SecretStore) -> None:
    config = SandboxFile(users={"bob": OTHER}, default=None)
    runner = runs_in(shared, config, os.environ, switch=True, secrets=store)
    steal = task("steal", "bob", "cat", str(shared / "secrets" / "alice" / "WANDB_API_KEY"))
    code, output = await run(runner, shared, steal)
    assert code != 0 and "Permission denied" in output and "alice-wandb-key" not in output


_AGENT_AFTER_DROPPING = """
import asyncio, os, socket, sys
from pathlib import Path
from qm.v1 import events_pb2, types_pb2
from libs.config.sandbox import SandboxFile, ScratchEntry
from services.node_agent import privileges
from services.node_agent.executors import ProcessExecutor
from services.node_agent.sandbox import Sandbox
from services.node_agent.tasklogs import TaskLogs

privileges.keep_only(privileges.needed(cgroups=False))
print("effective", privileges.capabilities("CapEff"), "bounding", privileges.capabilities("CapBnd"))
try:
    socket.socket().bind(("127.0.0.1", 80))  # a privileged port: no longer this agent's
    print("bound port 80")
except PermissionError:
    print("port 80 refused")
folder = Path(sys.argv[1])
config = SandboxFile(scratch=ScratchEntry(root=str(folder / "scratch")))
run = ProcessExecutor(TaskLogs(folder / "logs"), sandbox=Sandbox(config, os.environ, switch=True))
async def main():
    for task_id, why in (("j/0", "drained"), ("j/1", "")):  # attempt 2, after a drain
        placed = events_pb2.TaskPlaced(job_id="j", task_id=task_id, gpu_indices=[0],
            spec=types_pb2.JobSpec(user="alice", command=["sh", "-c", "id -u; ls; touch f"]))
        execution = await run.start(placed)
        print("task exit", await execution.wait())
        execution.cleanup(may_return=bool(why))
    await run.close()
asyncio.run(main())
"""


@as_root
def test_a_root_agent_keeps_only_the_capabilities_tasks_need(shared: Path) -> None:
    """Switching accounts, a second attempt's log and its job's scratch folder (kept for
    it, then removed as its account) still work; anything else root could do (here: bind
    a privileged port) is gone, for the agent and whatever it runs."""
    done = subprocess.run(
        [sys.executable, "-c", _AGENT_AFTER_DROPPING, str(shared)],
        capture_output=True, text=True, timeout=60, check=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    lines = done.stdout.splitlines()
    kept = sum(1 << cap for cap in privileges.needed(cgroups=False))
    assert lines[0] == f"effective {kept} bounding {kept}"
    assert lines[1:] == ["port 80 refused", "task exit 0", "task exit 0"]
    logs = TaskLogs(shared / "logs")
    # Attempt 2 found the file attempt 1 left in its working directory; then it was removed.
    assert logs.path("j", "j/0").read_text().splitlines()[1:] == [str(NOBODY)]
    assert logs.path("j", "j/1").read_text().splitlines()[1:] == [str(NOBODY), "f"]
    assert not (shared / "scratch" / "j").exists()
