"""Task logs: one per task, bounded on disk, read back whole, followed across rotations;
their names and folders safe whatever the ids."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import events_pb2

from services.node_agent.names import safe_name
from services.node_agent.tasklogs import OutputPipes, TaskLog, TaskLogs, read_log, rotated


async def read_all(path: Path, *, follow: bool = False, active: bool = False) -> bytes:
    return b"".join([chunk async for chunk in read_log(path, follow=follow, active=lambda: active)])


def placed(job_id: str, task_id: str, node_id: str = "n-1") -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(job_id=job_id, task_id=task_id, node_id=node_id)


@given(st.text(max_size=80), st.text(max_size=80))
def test_safe_names_are_one_to_one_and_stay_in_their_folder(one: str, other: str) -> None:
    for name in (safe_name(one), safe_name(other)):
        assert name not in ("", ".", "..") and "/" not in name and "\0" not in name
        assert not name.startswith(".") and len(name.encode()) <= 255
    assert (safe_name(one) == safe_name(other)) == (one == other)


def test_safe_names_of_the_ids_people_see_read_as_they_are() -> None:
    assert [safe_name(i) for i in ("j-1f3a", "2.1", "encode")] == ["j-1f3a", "2.1", "encode"]
    assert safe_name("../x") == "%2E.%2Fx"
    assert safe_name("x" * 300).startswith("~")


def test_each_attempt_and_part_of_a_job_has_its_own_log_listed_with_its_node(
    tmp_path: Path,
) -> None:
    logs = TaskLogs(tmp_path / "tasks")
    for task_id, node in (("j-1/0", "n-1"), ("j-1/1.0", "n-1"), ("j-1/1.1", "n-2")):
        sink = logs.open(placed("j-1", task_id, node), owner=None)
        sink.write(f"{task_id}\n".encode())
        sink.close()
    listed = {(e.task_id, e.node_id) for e in logs.entries("j-1")}
    assert listed == {("j-1/0", "n-1"), ("j-1/1.0", "n-1"), ("j-1/1.1", "n-2")}
    for task_id, _ in listed:
        assert logs.path("j-1", task_id).read_text() == f"{task_id}\n"
    assert logs.entries("j-2") == []
    job_folder = tmp_path / "tasks" / "j-1"
    assert sorted(os.listdir(job_folder)) == [
        "0.log", "0.task", "1.0.log", "1.0.task", "1.1.log", "1.1.task",
    ]  # fmt: skip
    for folder in (tmp_path / "tasks", job_folder):
        assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("job_id", "task_id"), [("../../etc", "../../etc/x"), ("j", "j/../../../x"), (".", "./..")]
)
def test_hostile_ids_keep_their_logs_in_the_log_folder(
    tmp_path: Path, job_id: str, task_id: str
) -> None:
    logs = TaskLogs(tmp_path / "tasks")
    logs.open(placed(job_id, task_id), owner=None).close()
    made = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert made and all(path.parent.parent == tmp_path / "tasks" for path in made)
    assert [e.task_id for e in logs.entries(job_id)] == [task_id]


def test_a_link_in_place_of_a_job_folder_is_not_followed(tmp_path: Path) -> None:
    logs = TaskLogs(tmp_path / "tasks")
    logs.prepare()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tasks" / "j-1").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="not a folder of this agent's"):
        logs.open(placed("j-1", "j-1/0"), owner=None)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_log_the_same_task_left_is_kept_as_its_older_part(tmp_path: Path) -> None:
    logs = TaskLogs(tmp_path / "tasks")
    for text in (b"before\n", b"after\n"):  # an agent restarted as the task ran
        sink = logs.open(placed("j-1", "j-1/0"), owner=None)
        sink.write(text)
        sink.close()
    path = logs.path("j-1", "j-1/0")
    assert (rotated(path).read_bytes(), path.read_bytes()) == (b"before\n", b"after\n")


async def test_a_log_reads_back_as_written(tmp_path: Path) -> None:
    log = TaskLog(tmp_path / "j.log", max_bytes=1 << 20, owner=None)
    log.write(b"hello ")
    log.write(b"world\n")
    log.close()
    assert await read_all(tmp_path / "j.log") == b"hello world\n"
    assert (tmp_path / "j.log").stat().st_mode & 0o777 == 0o600


async def test_past_its_bound_a_log_keeps_its_newest_part(tmp_path: Path) -> None:
    path = tmp_path / "j.log"
    log = TaskLog(path, max_bytes=10, owner=None)
    for n in range(10):
        log.write(f"line {n}\n".encode())  # 7 bytes each
    log.close()
    assert path.stat().st_size <= 10 and rotated(path).stat().st_size <= 10
    assert await read_all(path) == b"line 8\nline 9\n"


async def test_a_log_that_does_not_exist_reads_empty(tmp_path: Path) -> None:
    assert await read_all(tmp_path / "none.log", follow=True) == b""


async def test_following_sees_what_is_written_across_rotations_until_the_task_ends(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.log"
    log = TaskLog(path, max_bytes=16, owner=None)
    running = True
    read: list[bytes] = []

    async def follow() -> None:
        async for chunk in read_log(path, follow=True, active=lambda: running, poll_s=0.01):
            read.append(chunk)

    reader = asyncio.create_task(follow())
    for n in range(20):
        log.write(f"{n:02d}\n".encode())  # rotates every 5 lines
        await asyncio.sleep(0.02)
    log.close()
    running = False
    await asyncio.wait_for(reader, 5)
    assert b"".join(read) == b"".join(f"{n:02d}\n".encode() for n in range(20))


async def run_into_log(path: Path, script: str) -> bytes:
    """``script`` under sh with its stdout and stderr on pipes into a log; the log."""
    output = await OutputPipes.into(TaskLog(path, max_bytes=1 << 20, owner=None), None)
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", script, stdout=output.stdout, stderr=output.stderr, start_new_session=True
    )
    os.close(output.stdout)
    os.close(output.stderr)
    assert await asyncio.wait_for(process.wait(), 10) == 0
    await asyncio.wait_for(output.copying, 5)
    return path.read_bytes()


async def test_the_output_of_a_process_reaches_its_log_even_if_what_it_left_holds_the_pipes(
    tmp_path: Path,
) -> None:
    output = await OutputPipes.into(TaskLog(tmp_path / "j.log", max_bytes=100, owner=None), None)
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", "echo out; echo err >&2; sleep 30 &",
        stdout=output.stdout, stderr=output.stderr, start_new_session=True,
    )  # fmt: skip
    os.close(output.stdout)
    os.close(output.stderr)
    assert await asyncio.wait_for(process.wait(), 5) == 0  # the sleep holds the pipes open
    os.killpg(process.pid, signal.SIGKILL)
    await asyncio.wait_for(output.copying, 5)
    assert sorted((await read_all(tmp_path / "j.log")).splitlines()) == [b"err", b"out"]


async def test_a_stderr_line_never_lands_inside_a_stdout_line(tmp_path: Path) -> None:
    """stdout writes half a line, stderr a line, stdout the rest: the stdout line stays
    whole. A half line left quiet goes to the log on its own line (a prompt)."""
    script = (
        "printf 'half '; sleep 0.1; echo err >&2; sleep 0.1; echo 'whole'; "
        "printf 'prompt> '; sleep 1; echo again >&2; echo answer"
    )
    written = await run_into_log(tmp_path / "j.log", script)
    assert written.splitlines() == [b"err", b"half whole", b"prompt> ", b"again", b"answer"]
