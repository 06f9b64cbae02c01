"""Where a batch task's job runs, as the task is told: every part of a job spanning nodes
(``TaskPlaced.gang``, in rank order) and the rendezvous port on rank 0's node, or its one
node.

The placement comes off the bus, which the agent does not trust: a gang it cannot use
(too many parts, an address that is no single word, a port outside 1..65535, a task id
naming no part on this node) is a ``GangError`` saying what is wrong, for the task to
fail with; never the agent's crash.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass

from qm.v1 import events_pb2

from libs.config.inventory import node_address
from libs.core.ids import gang_rank
from libs.core.limits import MAX_GANG_NODES


class GangError(ValueError):
    """The placement's gang cannot be used; the message says why."""


@dataclass(frozen=True)
class Part:
    address: str
    gpus: int


@dataclass(frozen=True)
class Gang:
    """The job's parts in rank order (one, for a job on one node), this task's rank, and
    the port rank 0 listens on for the rendezvous (0 on one node)."""

    parts: tuple[Part, ...]
    rank: int
    master_port: int

    @property
    def spans_nodes(self) -> bool:
        return self.master_port != 0

    def environment(self) -> dict[str, str]:
        """What the task learns of its job's nodes (its hostfile's path aside)."""
        env = {
            "QM_NUM_NODES": str(len(self.parts)),
            "QM_NODE_RANK": str(self.rank),
            "QM_GPUS_PER_NODE": str(self.parts[self.rank].gpus),
            "QM_HOSTS": ",".join(part.address for part in self.parts),
        }
        if self.spans_nodes:
            env |= {"MASTER_ADDR": self.parts[0].address, "MASTER_PORT": str(self.master_port)}
        return env

    def hostfile(self) -> str:
        """The parts in DeepSpeed's and MPI's hostfile form, one line each in rank order."""
        return "".join(f"{part.address} slots={part.gpus}\n" for part in self.parts)


def gang_of(task: events_pb2.TaskPlaced, address: str) -> Gang:
    """The job's parts as ``task`` (a batch task placed on a node reached at ``address``)
    is told; ``GangError`` if its placement's gang cannot be used."""
    if not task.gang:
        return Gang((Part(address, len(task.gpu_indices)),), rank=0, master_port=0)
    if len(task.gang) > MAX_GANG_NODES:
        raise GangError(f"its gang has {len(task.gang)} parts, more than {MAX_GANG_NODES}")
    if not 1 <= task.master_port <= 65535:
        raise GangError(f"its gang's master port {task.master_port} is outside 1..65535")
    for position, part in enumerate(task.gang):
        try:
            node_address(part.address)
        except ValueError as exc:
            raise GangError(f"its gang's part {position}: address: {exc}") from None
    rank = gang_rank(task.task_id)
    if rank is None or rank >= len(task.gang):
        raise GangError(f"task id {task.task_id!r} names no rank of its {len(task.gang)} parts")
    mine = task.gang[rank]
    if (mine.node_id, mine.gpus) != (task.node_id, len(task.gpu_indices)):
        raise GangError(
            f"its gang's part {rank} is not its {len(task.gpu_indices)} GPU(s) on {task.node_id}"
        )
    parts = tuple(Part(part.address, part.gpus) for part in task.gang)
    return Gang(parts, rank=rank, master_port=task.master_port)


async def check_master_port(gang: Gang, address: str) -> None:
    """On rank 0's node (reached at ``address``, its own, not the bus's: no name of a
    stranger's to resolve): ``GangError`` if something listens on the rendezvous port
    there already (the task's own listener would fail, and its other parts wait for
    nothing). Other parts' nodes have nothing to check."""
    if not (gang.rank == 0 and gang.spans_nodes):
        return
    if await asyncio.to_thread(_listened_on, address, gang.master_port):
        raise GangError(
            f"the rendezvous port {gang.master_port} (MASTER_PORT) is taken on {address}"
        )


def _listened_on(address: str, port: int) -> bool:
    """Whether binding ``address``:``port`` fails because a socket holds it. One that
    cannot be tried here (the name does not resolve, the address is not this machine's)
    is not known to be taken: the task finds out itself."""
    try:
        found = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, protocol, _, where in found:
        with socket.socket(family, kind, protocol) as probe:
            # As the rendezvous binds: connections of an earlier attempt still in
            # TIME_WAIT do not hold the port, a listener does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(where)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False
