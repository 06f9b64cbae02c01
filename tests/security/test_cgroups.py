"""A task in cgroups of its own (where the host lets the agent make them): it cannot use
more memory than its GPUs come with, cannot open GPU devices it was not given, and
leaves nothing running behind it. Needs a root agent on a host with writable cgroups
(as in CI); elsewhere the tests say so and skip. The GPU device test stands /dev/zero
(1:5) in for the task's GPU and /dev/null (1:3) for another's: the same rules, devices
this host has."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.config.document import ConfigError
from libs.config.sandbox import CgroupsEntry, SandboxFile, ScratchEntry
from services.node_agent.cgroups import TaskCgroups, char_major, device_rules
from services.node_agent.executors import ProcessExecutor
from services.node_agent.sandbox import Sandbox
from services.node_agent.tasklogs import TaskLogs
from tests.integration.test_node_liveness import alive

ROOT = Path("/sys/fs/cgroup")


def own_cgroup(controller: str) -> Path | None:
    """Where this process's cgroup of ``controller`` is (v1), or its v2 cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return ROOT / controller / path.lstrip("/")
        if names == "" and controller in (ROOT / "cgroup.controllers").read_text().split():
            return ROOT / path.lstrip("/")
    return None


def parent_for(controller: str, control_file: str) -> Iterator[Path]:
    """A parent folder for the tests' cgroups, if this host lets a root process make
    cgroups that ``controller`` controls (its ``control_file`` appears in them)."""
    folder = own_cgroup(controller)
    if os.geteuid() != 0 or folder is None:
        pytest.skip(f"this host lets no root agent make {controller} cgroups here")
    parent = folder / f"qm-test-{uuid.uuid4().hex[:8]}"
    try:
        parent.mkdir()
        with contextlib.suppress(OSError):  # cgroup v2: pass the controller down
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        (parent / "probe").mkdir()
        controlled = (parent / "probe" / control_file).exists()
        (parent / "probe").rmdir()
    except OSError as exc:
        pytest.skip(f"cannot make a {controller} cgroup in {folder}: {exc.strerror}")
    if not controlled:
        parent.rmdir()
        pytest.skip(f"{folder} does not pass the {controller} controller to its cgroups")
    yield parent
    for child in cgroups_in(parent) if parent.exists() else ():
        child.rmdir()
    parent.rmdir()


@pytest.fixture
def memory_parent() -> Iterator[Path]:
    v2 = (ROOT / "cgroup.controllers").exists()
    yield from parent_for("memory", "memory.max" if v2 else "memory.limit_in_bytes")


@pytest.fixture
def devices_parent() -> Iterator[Path]:
    yield from parent_for("devices", "devices.deny")  # cgroup v1 only


def runner(folder: Path, cgroups: TaskCgroups) -> ProcessExecutor:
    config = SandboxFile(default="nobody", scratch=ScratchEntry(root=str(folder / "scratch")))
    sandbox = Sandbox(config, os.environ, switch=True, cgroups=cgroups)
    return ProcessExecutor(TaskLogs(folder / "logs"), sandbox=sandbox)


def log_of(folder: Path, job_id: str) -> Path:
    return TaskLogs(folder / "logs").path(job_id, f"{job_id}/0")


def task(job_id: str, command: str, gpus: tuple[int, ...] = (0,)) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id=job_id, task_id=f"{job_id}/0", node_id="n", gpu_indices=gpus,
        spec=types_pb2.JobSpec(user="alice", command=["sh", "-c", command]),
    )  # fmt: skip


async def outcome(executor: ProcessExecutor, logs: Path, placed: events_pb2.TaskPlaced) -> int:
    return await (await executor.start(placed)).wait()


async def test_a_task_gets_the_memory_its_gpus_come_with(memory_parent: Path, shared: Path) -> None:
    cgroups = TaskCgroups(CgroupsEntry(parents=[str(memory_parent)], memory_per_gpu_gib=0.0625))
    executor = runner(shared, cgroups)
    # dd holds one block of bs bytes: 32 MB fits in 64 MB (1 GPU), 200 MB does not
    fits = task("fits", "dd if=/dev/zero of=/dev/null bs=32M count=1 2>&1; id -u")
    assert await outcome(executor, shared, fits) == 0
    assert "65534" in log_of(shared, "fits").read_text()
    greedy = task("greedy", "dd if=/dev/zero of=/dev/null bs=200M count=1")
    assert await outcome(executor, shared, greedy) in (-9, 137)  # the kernel's OOM kill
    block = "dd if=/dev/zero of=/dev/null bs=100M count=1"
    assert await outcome(executor, shared, task("one", block)) in (-9, 137)  # > 64 MB
    assert await outcome(executor, shared, task("two", block, gpus=(0, 1))) == 0  # < 128 MB
    assert cgroups_in(memory_parent) == [], "each task's cgroup is removed"


async def test_a_task_opens_only_the_gpu_devices_it_was_given(
    devices_parent: Path, shared: Path
) -> None:
    cgroups = TaskCgroups(CgroupsEntry(parents=[str(devices_parent)]), gpu_major=1)
    executor = runner(shared, cgroups)
    given = task("given", "head -c 3 /dev/zero | wc -c", gpus=(5,))  # 1:5 is /dev/zero
    assert await outcome(executor, shared, given) == 0
    assert log_of(shared, "given").read_text().split()[-1] == "3"
    other = task("other", "echo x > /dev/null", gpus=(5,))  # 1:3, not given
    assert await outcome(executor, shared, other) != 0
    assert "Operation not permitted" in log_of(shared, "other").read_text()


async def test_nothing_a_task_started_outlives_it(memory_parent: Path, shared: Path) -> None:
    cgroups = TaskCgroups(CgroupsEntry(parents=[str(memory_parent)], memory_per_gpu_gib=1))
    left = task("left", "sleep 300 & echo $! > /dev/stderr; exec sleep 0.5")
    execution = await runner(shared, cgroups).start(left)
    assert await execution.wait() == 0
    child = int(log_of(shared, "left").read_text().split()[-1])  # what it left running
    for _ in range(100):
        if not alive(child):
            break
        await asyncio.sleep(0.05)
    assert not alive(child), "the task's child outlived it"
    assert cgroups_in(memory_parent) == []


def cgroups_in(parent: Path) -> list[Path]:
    return [child for child in parent.iterdir() if child.is_dir()]


def test_device_rules_deny_every_gpu_but_the_tasks() -> None:
    rules = device_rules(195, [3, 1, 3])
    assert rules[:3] == ["c 195:0 rwm", "c 195:2 rwm", "c 195:4 rwm"]
    assert len(rules) == 255 - 2 and "c 195:255 rwm" not in rules  # nvidiactl stays open


def test_the_gpu_driver_is_found_by_name(tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    devices.write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\n"
        "Block devices:\n  7 loop\n195 nvidia\n"
    )
    assert char_major("nvidia-frontend", devices) == 195
    assert char_major("nvidia-uvm", devices) == 508
    assert char_major("nvidia", devices) is None  # a block device of that name is not it


def test_a_parent_that_is_no_cgroup_stops_the_agent(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a cgroup folder this agent may make"):
        TaskCgroups(CgroupsEntry(parents=[str(tmp_path)]))


def test_a_memory_limit_that_no_parent_applies_stops_the_agent(devices_parent: Path) -> None:
    """A limit the host would silently ignore is no limit."""
    with pytest.raises(ConfigError, match="no parent gives its cgroups a memory controller"):
        TaskCgroups(CgroupsEntry(parents=[str(devices_parent)], memory_per_gpu_gib=1))
