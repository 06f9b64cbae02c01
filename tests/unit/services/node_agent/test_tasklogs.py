"""A task's log: bounded on disk, read back whole, followed across rotations."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from services.node_agent.tasklogs import OutputPipe, TaskLog, read_log, rotated


async def read_all(path: Path, *, follow: bool = False, active: bool = False) -> bytes:
    return b"".join([chunk async for chunk in read_log(path, follow=follow, active=lambda: active)])


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


async def test_the_output_of_a_process_reaches_its_log_even_if_what_it_left_holds_the_pipe(
    tmp_path: Path,
) -> None:
    output = await OutputPipe.into(TaskLog(tmp_path / "j.log", max_bytes=100, owner=None), None)
    script = "echo out; echo err >&2; sleep 30 &"
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", script, stdout=output.write_fd, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    os.close(output.write_fd)
    assert await asyncio.wait_for(process.wait(), 5) == 0  # the sleep holds the pipe open
    os.killpg(process.pid, signal.SIGKILL)
    await asyncio.wait_for(output.copying, 5)
    assert await read_all(tmp_path / "j.log") == b"out\nerr\n"
