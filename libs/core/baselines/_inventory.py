"""Free GPUs per node and where a job fits, shared by the baseline policies.

A job that fits on one node of the cluster always gets one node (the first by
id with room, lowest GPU indices first); a larger job is a gang over whole
free nodes, one placement per node.
"""

from __future__ import annotations

from collections.abc import Mapping

from libs.core.ids import NodeId
from libs.core.model import NodeSpec

Placement = tuple[tuple[NodeId, tuple[int, ...]], ...]  # (node id, GPU indices) per node


class Inventory:
    def __init__(self) -> None:
        self._nodes: dict[NodeId, NodeSpec] = {}
        self._order: list[NodeId] = []  # node ids, sorted
        self._size: dict[NodeId, int] = {}
        self._free: dict[NodeId, list[int]] = {}  # sorted indices
        self._held: dict[NodeId, set[int]] = {}  # membership only, never iterated
        self._largest_free: int | None = None  # cached until GPUs move
        self._largest_node: dict[str, int] = {}  # GPU type ("" any) -> cached until a join

    @property
    def capacity(self) -> int:
        return sum(self._size.values())

    def size(self, node_id: NodeId) -> int:
        return self._size.get(node_id, 0)

    def gpu_type(self, node_id: NodeId) -> str:
        node = self._nodes.get(node_id)
        return node.gpu_type if node else ""

    def free(self, node_id: NodeId) -> int:
        return len(self._free.get(node_id, ()))

    def join(self, node: NodeSpec) -> None:
        """A node (re)registers; GPUs held by running tasks stay held."""
        if node.node_id not in self._nodes:
            self._order = sorted([*self._order, node.node_id])
        self._nodes[node.node_id] = node
        self._size[node.node_id] = node.gpu_count
        held = self._held.setdefault(node.node_id, set())
        self._free[node.node_id] = [g for g in sorted(node.gpu_indices) if g not in held]
        self._largest_free = None
        self._largest_node = {}

    def take(self, node_id: NodeId, gpus: tuple[int, ...]) -> None:
        taken = set(gpus)
        self._free[node_id] = [g for g in self._free[node_id] if g not in taken]
        self._held[node_id].update(gpus)
        self._largest_free = None

    def release(self, node_id: NodeId, gpus: tuple[int, ...]) -> None:
        held = self._held.get(node_id, set())
        back = [g for g in gpus if g in held]
        held.difference_update(back)
        node = self._nodes.get(node_id)
        if node is not None:
            present = [g for g in back if g in node.gpu_indices]
            self._free[node_id] = sorted(self._free[node_id] + present)
        self._largest_free = None

    def _largest_free_block(self) -> int:
        """The most free GPUs on one node."""
        if self._largest_free is None:
            self._largest_free = max(map(len, self._free.values()), default=0)
        return self._largest_free

    def could_ever_fit(self, gpus: int, gpu_type: str) -> bool:
        if self._largest(gpu_type) >= gpus:
            return True
        return sum(self._size[n] for n in self._matching(gpu_type)) >= gpus

    def fit(self, gpus: int, gpu_type: str) -> Placement | None:
        nodes = self._matching(gpu_type)
        if self._largest(gpu_type) >= gpus:
            if gpus > self._largest_free_block():
                return None
            for node_id in nodes:
                free = self._free[node_id]
                if len(free) >= gpus:
                    return ((node_id, tuple(free[:gpus])),)
            return None
        chosen: list[tuple[NodeId, tuple[int, ...]]] = []
        remaining = gpus
        for node_id in nodes:
            free = self._free[node_id]
            if free and len(free) == self._size[node_id]:
                chosen.append((node_id, tuple(free[:remaining])))
                remaining -= len(chosen[-1][1])
                if remaining == 0:
                    return tuple(chosen)
        return None

    def nodes(self, gpu_type: str) -> list[NodeId]:
        """The nodes a job of ``gpu_type`` ("" any) may run on, by id."""
        return self._matching(gpu_type)

    def would_fit(self, gpus: int, gpu_type: str, free: Mapping[NodeId, int]) -> bool:
        """Whether ``fit`` would place the job were ``free`` the free GPUs of each of
        ``nodes(gpu_type)``: one node with room, or else enough whole free nodes."""
        nodes = self._matching(gpu_type)
        if self._largest(gpu_type) >= gpus:
            return any(free[n] >= gpus for n in nodes)
        return sum(self._size[n] for n in nodes if free[n] == self._size[n]) >= gpus

    def _largest(self, gpu_type: str) -> int:
        largest = self._largest_node.get(gpu_type)
        if largest is None:
            largest = max((self._size[n] for n in self._matching(gpu_type)), default=0)
            self._largest_node[gpu_type] = largest
        return largest

    def _matching(self, gpu_type: str) -> list[NodeId]:
        if not gpu_type:
            return self._order
        return [n for n in self._order if self._nodes[n].gpu_type == gpu_type]
