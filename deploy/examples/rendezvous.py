"""A job spanning nodes, smallest form: its parts meet at rank 0 and agree on a sum.

    qm submit --nodes 2 --gpus-per-node 1 -- python3 "$PWD/deploy/examples/rendezvous.py"

A task starts in its own folder: give the path whole, and one its account can read.

Each part reads what its node agent tells it (QM_NODE_RANK, QM_NUM_NODES, MASTER_ADDR,
MASTER_PORT). Rank 0 listens at MASTER_ADDR:MASTER_PORT and takes a number from every
other rank, one line each ("RANK VALUE"); it adds its own and sends the sum back to each
as one line. Every rank prints ``rank R of N: sum = S``. A rank's number is R + 1 unless
--value says otherwise, so 2 ranks sum to 3. Exit 0 once it has the sum; 1 with a
message on stderr when the others do not come within --timeout seconds or the
environment is not a gang's. Standard library only.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RETRY_S = 0.2  # between connection attempts while rank 0 is not listening yet


class Failed(Exception):
    """The rendezvous cannot happen; the message says why."""


@dataclass(frozen=True)
class Part:
    rank: int
    ranks: int
    host: str
    port: int


def part_from(env: Mapping[str, str]) -> Part:
    """This part as its environment describes it; ``Failed`` naming a bad variable."""
    names = ("QM_NODE_RANK", "QM_NUM_NODES", "MASTER_ADDR", "MASTER_PORT")
    missing = [name for name in names if not env.get(name)]
    if missing:
        raise Failed(f"not run as a part of a job spanning nodes: no {', '.join(missing)}")
    rank, ranks, port = (
        _number(env, name) for name in ("QM_NODE_RANK", "QM_NUM_NODES", "MASTER_PORT")
    )
    if not 0 <= rank < ranks:
        raise Failed(f"QM_NODE_RANK={rank} is not below QM_NUM_NODES={ranks}")
    if not 1 <= port <= 65535:
        raise Failed(f"MASTER_PORT={port} is outside 1..65535")
    return Part(rank, ranks, env["MASTER_ADDR"], port)


def _number(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    if not (text.isascii() and text.isdigit()):
        raise Failed(f"{name}={text!r} is not a whole number")
    return int(text)


def rendezvous(part: Part, value: int, timeout_s: float) -> int:
    """The sum of every rank's value, agreed with the others within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    if part.rank == 0:
        return _gather(part, value, deadline)
    return _contribute(part, value, deadline)


def _gather(part: Part, value: int, deadline: float) -> int:
    """Rank 0: take every other rank's value, send each the sum."""
    family = socket.AF_INET6 if ":" in part.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as server:
        # A rerun of the job may find the last one's connections in TIME_WAIT.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((part.host, part.port))
        except OSError as exc:
            raise Failed(f"cannot listen on {part.host}:{part.port}: {exc.strerror}") from None
        server.listen(part.ranks)
        peers: dict[int, socket.socket] = {}
        total = value
        try:
            while len(peers) < part.ranks - 1:
                server.settimeout(_left(deadline, f"{len(peers) + 1} of {part.ranks} ranks came"))
                try:
                    peer, _ = server.accept()
                except TimeoutError:
                    continue  # _left says how many came
                peer.settimeout(_left(deadline, "a rank did not send its number"))
                rank, number = _read(peer, 2, "a rank's number")
                if not 0 < rank < part.ranks or rank in peers:
                    peer.close()
                    raise Failed(f"a peer said it is rank {rank}: not one awaited")
                peers[rank] = peer
                total += number
            for peer in peers.values():
                peer.sendall(f"{total}\n".encode())
        finally:
            for peer in peers.values():
                peer.close()
    return total


def _contribute(part: Part, value: int, deadline: float) -> int:
    """Another rank: send its value to rank 0, read the sum back."""
    while True:
        try:
            left = _left(deadline, f"rank 0 at {part.host}:{part.port} did not answer")
            connection = socket.create_connection((part.host, part.port), timeout=left)
            break
        except (ConnectionError, TimeoutError):  # not listening yet
            time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))
        except OSError as exc:
            raise Failed(f"cannot reach rank 0 at {part.host}:{part.port}: {exc}") from None
    with connection:
        connection.sendall(f"{part.rank} {value}\n".encode())
        connection.settimeout(_left(deadline, "rank 0 did not send the sum"))
        (total,) = _read(connection, 1, "the sum")
    return total


def _left(deadline: float, what: str) -> float:
    """The seconds left before ``deadline``; ``Failed`` saying ``what`` once none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Failed(f"timed out: {what}")
    return left


def _read(connection: socket.socket, count: int, what: str) -> list[int]:
    """One line of ``count`` whole numbers from ``connection``."""
    line = b""
    try:
        while not line.endswith(b"\n") and len(line) < 256:
            chunk = connection.recv(256 - len(line))
            if not chunk:
                break
            line += chunk
    except TimeoutError:
        raise Failed(f"timed out waiting for {what}") from None
    except OSError as exc:
        raise Failed(f"lost the connection waiting for {what}: {exc}") from None
    try:
        numbers = [int(word) for word in line.decode().split()]
    except ValueError:  # not UTF-8 (UnicodeDecodeError is one) or not a number
        numbers = []
    if len(numbers) != count:
        raise Failed(f"expected {what} as {count} number(s) on a line, got {line[:80]!r}")
    return numbers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Meet the job's other parts at rank 0 and print the sum of their numbers."
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the other ranks (default: %(default)s)",
    )
    parser.add_argument("--value", type=int, help="this rank's number (default: its rank + 1)")
    args = parser.parse_args(argv)
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        parser.error("--timeout must be a number of seconds > 0")
    try:
        part = part_from(os.environ)
        total = rendezvous(part, part.rank + 1 if args.value is None else args.value, args.timeout)
    except Failed as exc:
        print(f"rendezvous: {exc}", file=sys.stderr)
        return 1
    print(f"rank {part.rank} of {part.ranks}: sum = {total}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
