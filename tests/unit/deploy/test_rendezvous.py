"""deploy/examples/rendezvous.py: a gang's parts meet at rank 0 and agree on a sum, as
processes on 127.0.0.1 told what a node agent tells them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RENDEZVOUS = ROOT / "deploy" / "examples" / "rendezvous.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start(
    rank: int, ranks: int, port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    told = {
        "QM_NODE_RANK": str(rank),
        "QM_NUM_NODES": str(ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return subprocess.Popen(
        [sys.executable, str(RENDEZVOUS), *args],
        env={"PATH": os.environ.get("PATH", ""), **(told if env is None else env)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(part: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = part.communicate(timeout=30)
    return part.returncode, out, err


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_parts_agree_on_the_sum_whoever_comes_first(ranks: int) -> None:
    """The other ranks start first: they retry until rank 0 listens."""
    port = free_port()
    others = [start(rank, ranks, port) for rank in range(1, ranks)]
    time.sleep(0.5)
    parts = [start(0, ranks, port), *others]
    total = sum(range(1, ranks + 1))  # each rank's number is its rank + 1
    for rank, part in enumerate(parts):
        assert ended(part) == (0, f"rank {rank} of {ranks}: sum = {total}\n", "")


def test_a_part_may_bring_its_own_number() -> None:
    port = free_port()
    parts = [start(0, 2, port, "--value", "40"), start(1, 2, port, "--value", "2")]
    assert [ended(part)[:2] for part in parts] == [
        (0, "rank 0 of 2: sum = 42\n"),
        (0, "rank 1 of 2: sum = 42\n"),
    ]


def test_rank_0_gives_up_when_the_others_do_not_come() -> None:
    code, out, err = ended(start(0, 3, free_port(), "--timeout", "0.5"))
    assert (code, out) == (1, "")
    assert err == "rendezvous: timed out: 1 of 3 ranks came\n"


def test_a_rank_gives_up_when_rank_0_does_not_listen() -> None:
    port = free_port()
    code, out, err = ended(start(1, 2, port, "--timeout", "0.5"))
    assert (code, out) == (1, "")
    assert err == f"rendezvous: timed out: rank 0 at 127.0.0.1:{port} did not answer\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "not run as a part of a job spanning nodes: no QM_NODE_RANK, QM_NUM_NODES, "),
        (
            {"QM_NODE_RANK": "2", "QM_NUM_NODES": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "QM_NODE_RANK=2 is not below QM_NUM_NODES=2",
        ),
        (
            {"QM_NODE_RANK": "0", "QM_NUM_NODES": "2", "MASTER_ADDR": "h", "MASTER_PORT": "x"},
            "MASTER_PORT='x' is not a whole number",
        ),
        (
            {"QM_NODE_RANK": "0", "QM_NUM_NODES": "2", "MASTER_ADDR": "h", "MASTER_PORT": "0"},
            "MASTER_PORT=0 is outside 1..65535",
        ),
    ],
)
def test_a_bad_environment_is_named(env: dict[str, str], message: str) -> None:
    code, out, err = ended(start(0, 0, 0, env=env))
    assert (code, out) == (1, "")
    assert err.startswith(f"rendezvous: {message}")
