"""deploy/local/supervise.py: restarts with backoff, logs why, stops its service on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]
SUPERVISE = ROOT / "deploy" / "local" / "supervise.py"
sys.path.insert(0, str(SUPERVISE.parent))
from supervise import Backoff, describe_exit  # noqa: E402


def test_backoff_doubles_from_1_to_30_s_and_resets_after_60_s_up() -> None:
    backoff = Backoff()
    assert [backoff.delay(uptime_s=0.5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(uptime_s=60) == 1
    assert backoff.delay(uptime_s=59) == 2


@given(st.lists(st.floats(min_value=0, max_value=200), max_size=40))
def test_backoff_stays_in_bounds_and_only_a_long_run_resets_it(uptimes: list[float]) -> None:
    backoff = Backoff()
    previous = 0.0
    for uptime in uptimes:
        delay = backoff.delay(uptime)
        assert 1 <= delay <= 30
        if uptime >= 60:
            assert delay == 1
        elif previous:
            assert delay == min(previous * 2, 30)
        previous = delay


def test_exit_codes_and_signals_are_described() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"


def test_the_backoff_refuses_an_initial_wait_above_the_longest() -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial_s=5, max_s=1)


Start = Callable[..., tuple[subprocess.Popen[bytes], Path, Path]]


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Start]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*command: str, grace: float = 5.0) -> tuple[subprocess.Popen[bytes], Path, Path]:
        log, pidfile = tmp_path / "service.log", tmp_path / "service.pid"
        process = subprocess.Popen(
            [sys.executable, str(SUPERVISE), "--name", "svc", "--child-pidfile", str(pidfile),
             "--initial-backoff", "0.05", "--max-backoff", "0.2", "--grace", str(grace),
             "--", *command],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(process)
        return process, log, pidfile

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_until(probe: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def child_pid(pidfile: Path) -> int:
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    return int(pidfile.read_text())


def test_a_crashing_service_is_restarted_with_each_restart_logged(supervise: Start) -> None:
    process, log, _ = supervise(sys.executable, "-c", "import sys; sys.exit(3)")
    wait_until(lambda: log.read_text().count("exited with code 3") >= 3)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    text = log.read_text()
    assert "restart 1 in 0.05 s" in text
    assert "restart 2 in 0.1 s" in text


def test_a_killed_service_comes_back_with_a_new_pid(supervise: Start) -> None:
    process, log, pidfile = supervise("sleep", "60")
    first = child_pid(pidfile)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() not in ("", str(first)))
    assert "was killed by SIGKILL" in log.read_text()
    second = int(pidfile.read_text())
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert not alive(second)
    assert not pidfile.exists()


def test_sigterm_stops_the_service_and_kills_one_that_ignores_it(supervise: Start) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    process, log, pidfile = supervise(sys.executable, "-c", stubborn, grace=0.5)
    pid = child_pid(pidfile)
    time.sleep(0.3)  # let the child install its handler
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert not alive(pid)
    assert "did not stop in 0.5 s: SIGKILL" in log.read_text()
