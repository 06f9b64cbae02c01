"""A batch task learns where its job runs: its nodes, its rank, where to rendezvous and a
hostfile of its own; a gang the agent cannot use fails its task, never the agent."""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from qm.v1 import events_pb2, types_pb2

from services.node_agent.agent import NodeAgent
from services.node_agent.executors import task_environment
from services.node_agent.gangs import Gang, Part, gang_of
from services.node_agent.inventory import parse_inventory
from services.node_agent.launch import LaunchError
from services.node_agent.scratch import ScratchFolders
from tests.unit.services.node_agent.doubles import (
    Recorder,
    delivery,
    executors,
    process_executor,
    task_log,
)

ADDRESSES = ("10.0.0.1", "10.0.0.2", "gpu-2.example.org")


def part_of(
    rank: int | None,
    *,
    attempt: int = 0,
    gpus: tuple[int, ...] | None = None,
    addresses: tuple[str, ...] = ADDRESSES,
    port: int = 29500,
    command: tuple[str, ...] = ("true",),
) -> events_pb2.TaskPlaced:
    """Rank ``rank`` of a gang with a part on each of ``addresses`` (node ``n-R``, 2 GPUs
    each but rank 1's 4); a job on one node without ``rank``."""
    if gpus is None:
        gpus = (0, 1, 2, 3) if rank == 1 else (0, 1)
    task = events_pb2.TaskPlaced(
        job_id="job-1",
        task_id=f"job-1/{attempt}" if rank is None else f"job-1/{attempt}.{rank}",
        node_id=f"n-{rank or 0}",
        gpu_indices=gpus,
        spec=types_pb2.JobSpec(command=command),
    )
    if rank is not None:
        task.master_port = port
        task.gang.extend(
            events_pb2.GangPart(node_id=f"n-{r}", address=a, gpus=4 if r == 1 else 2)
            for r, a in enumerate(addresses)
        )
    return task


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def the_agents(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("QM_") or k.startswith("MASTER_")}


def test_a_gang_part_learns_its_nodes_its_rank_and_where_to_rendezvous() -> None:
    task = part_of(1, attempt=2)
    gang = gang_of(task, "10.0.0.2")
    assert gang == Gang(
        (Part("10.0.0.1", 2), Part("10.0.0.2", 4), Part("gpu-2.example.org", 2)),
        rank=1,
        master_port=29500,
    )
    # The job's own variables cannot move its rendezvous.
    task.spec.env.update({"MASTER_PORT": "1", "QM_NODE_RANK": "0"})
    env = task_environment(
        {}, task, gang=gang, files={"QM_HOSTFILE": Path("/scratch/job-1/hostfile-2.1")}
    )
    assert the_agents(env) == {
        "QM_JOB_ID": "job-1",
        "QM_TASK_ID": "job-1/2.1",
        "QM_RESTART_COUNT": "2",
        "QM_NUM_NODES": "3",
        "QM_NODE_RANK": "1",
        "QM_GPUS_PER_NODE": "4",
        "QM_HOSTS": "10.0.0.1,10.0.0.2,gpu-2.example.org",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "QM_HOSTFILE": "/scratch/job-1/hostfile-2.1",
    }
    assert gang.hostfile() == ("10.0.0.1 slots=2\n10.0.0.2 slots=4\ngpu-2.example.org slots=2\n")


def test_a_job_on_one_node_learns_it_is_alone() -> None:
    task = part_of(None, attempt=3, gpus=(2, 5))
    env = task_environment({}, task, gang=gang_of(task, "gpu-0.example.org"))
    assert the_agents(env) == {
        "QM_JOB_ID": "job-1",
        "QM_TASK_ID": "job-1/3",
        "QM_RESTART_COUNT": "3",
        "QM_NUM_NODES": "1",
        "QM_NODE_RANK": "0",
        "QM_GPUS_PER_NODE": "2",
        "QM_HOSTS": "gpu-0.example.org",
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


SHOWS_ITS_PLACE = python(
    "import os; e = os.environ; "
    "print(e['QM_NODE_RANK'], e['QM_HOSTS'], e['MASTER_ADDR'], e['MASTER_PORT'], "
    "e['QM_HOSTFILE']); print(open(e['QM_HOSTFILE']).read(), end='')"
)


async def test_each_part_reads_its_own_hostfile_in_its_jobs_folder(tmp_path: Path) -> None:
    """The parts an agent hosts share their job's folder: each has a file of its own
    there, its account's alone (the folder is too)."""
    port = free_port()
    local = ("127.0.0.1", "127.0.0.2")
    executor = process_executor(tmp_path)
    for rank in (0, 1):
        task = part_of(rank, addresses=local, port=port, command=SHOWS_ITS_PLACE)
        assert await (await executor.start(task, address=local[rank])).wait() == 0
    folder = tmp_path / "scratch" / "job-1"
    for rank in (0, 1):
        hostfile = folder / f"hostfile-0.{rank}"
        lines = task_log(tmp_path, task_id=f"job-1/0.{rank}").read_text().splitlines()
        assert lines[1:] == [
            f"{rank} 127.0.0.1,127.0.0.2 127.0.0.1 {port} {hostfile}",
            "127.0.0.1 slots=2",
            "127.0.0.2 slots=4",
        ]
        found = hostfile.stat()
        assert (stat.S_IMODE(found.st_mode), found.st_uid) == (0o600, folder.stat().st_uid)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


async def test_a_job_on_one_node_gets_no_hostfile(tmp_path: Path) -> None:
    code = "import os; print(sorted(k for k in os.environ if k.startswith(('QM_H', 'MASTER'))))"
    task = part_of(None, command=python(code))
    assert await (await process_executor(tmp_path).start(task, address="127.0.0.1")).wait() == 0
    assert task_log(tmp_path).read_text().splitlines()[1] == "['QM_HOSTS']"
    assert os.listdir(tmp_path / "scratch" / "job-1") == []


async def test_a_hostfile_that_cannot_be_written_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def full(*args: object) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ScratchFolders, "write", full)
    executor = process_executor(tmp_path)
    with pytest.raises(LaunchError) as caught:
        await executor.start(part_of(1, port=free_port()), address="10.0.0.2")
    assert (caught.value.reason, caught.value.exit_code) == (
        "cannot write the job's hostfile: [Errno 28] No space left on device",
        126,
    )
    await executor.close()  # the job's folder goes with it, in the background
    assert not (tmp_path / "scratch" / "job-1").exists()


def hostile(change: str) -> events_pb2.TaskPlaced:
    task = part_of(1)
    if change == "too many parts":
        task.gang.extend(task.gang[0] for _ in range(126))
    elif change == "an empty address":
        task.gang[2].address = ""
    elif change == "an address with a space":
        task.gang[2].address = "10.0.0.3 -oProxyCommand=x"
    elif change == "a long address":
        task.gang[2].address = "a" * 254
    elif change == "port 0":
        task.master_port = 0
    elif change == "port 65536":
        task.master_port = 65536
    elif change == "a rank beyond the gang":
        task.task_id = "job-1/0.3"
    elif change == "a part not this node's":
        task.node_id = "n-2"
    return task


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("too many parts", "its gang has 129 parts, more than 128"),
        (
            "an empty address",
            "its gang's part 2: address: expected a host name or IP address, got an empty one",
        ),
        (
            "an address with a space",
            "its gang's part 2: address: expected no whitespace or control characters, got "
            "'10.0.0.3 -oProxyCommand=x'",
        ),
        (
            "a long address",
            "its gang's part 2: address: expected at most 253 characters, got 254: "
            f"{'a' * 40!r}...",
        ),
        ("port 0", "its gang's master port 0 is outside 1..65535"),
        ("port 65536", "its gang's master port 65536 is outside 1..65535"),
        ("a rank beyond the gang", "task id 'job-1/0.3' names no rank of its 3 parts"),
        ("a part not this node's", "its gang's part 1 is not its 4 GPU(s) on n-2"),
    ],
)
async def test_a_gang_the_agent_cannot_use_fails_its_task(
    tmp_path: Path, change: str, reason: str
) -> None:
    with pytest.raises(LaunchError) as caught:
        await process_executor(tmp_path).start(hostile(change), address="10.0.0.2")
    assert (caught.value.reason, caught.value.exit_code) == (reason, 126)
    assert not (tmp_path / "scratch" / "job-1").exists()  # nothing made for it


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something listens on at 127.0.0.1."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


async def test_rank_0_fails_at_start_when_its_rendezvous_port_is_taken(
    tmp_path: Path, listening: int
) -> None:
    local = ("127.0.0.1", "127.0.0.2")
    executor = process_executor(tmp_path)
    with pytest.raises(LaunchError) as caught:
        await executor.start(part_of(0, addresses=local, port=listening), address=local[0])
    assert (caught.value.reason, caught.value.exit_code) == (
        f"the rendezvous port {listening} (MASTER_PORT) is taken on 127.0.0.1",
        126,
    )
    # Only rank 0 listens there: another part has nothing to check.
    other = await executor.start(part_of(1, addresses=local, port=listening), address=local[1])
    assert await other.wait() == 0


NODES = parse_inventory(
    yaml.safe_load(
        """
nodes:
  - {node_id: n-0, gpu_type: H100, gpu_count: 2, gpu_memory_gib: 80, address: 127.0.0.1}
  - {node_id: n-1, gpu_type: H100, gpu_count: 4, gpu_memory_gib: 80, address: 127.0.0.2}
"""
    ),
    source="test",
)


async def test_the_agent_reports_a_gang_it_cannot_use_as_its_tasks_failure(
    tmp_path: Path, emitted: Recorder
) -> None:
    agent = NodeAgent(NODES, executors=executors(tmp_path), emit=emitted)
    assert await agent.handle(delivery(hostile("too many parts")))
    assert emitted.types() == ["task_failed"]
    failed = emitted.events[0].task_failed
    assert (failed.task_id, failed.exit_code, failed.reason) == (
        "job-1/0.1",
        126,
        "its gang has 129 parts, more than 128",
    )
    await agent.shutdown()


async def test_a_part_learns_its_nodes_address_from_the_inventory(
    tmp_path: Path, emitted: Recorder
) -> None:
    agent = NodeAgent(NODES, executors=executors(tmp_path), emit=emitted)
    code = "import os; print(os.environ['QM_HOSTS'])"
    assert await agent.handle(delivery(part_of(None, gpus=(0,), command=python(code))))
    await emitted.until(1, "task_finished")
    assert task_log(tmp_path).read_text().splitlines()[1] == "127.0.0.1"
    await agent.shutdown()
