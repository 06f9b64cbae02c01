"""A simulated cluster's shape: identical nodes, named so that sorting keeps their order."""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.ids import NodeId
from libs.core.model import NodeSpec


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 48
    gpus_per_node: int = 8
    gpu_type: str = "V100"
    gpu_memory_gib: float = 32.0

    def node_specs(self) -> tuple[NodeSpec, ...]:
        width = len(str(max(self.nodes - 1, 0)))
        return tuple(
            NodeSpec(
                node_id=NodeId(f"node-{i:0{width}d}"),
                gpu_type=self.gpu_type,
                gpu_indices=tuple(range(self.gpus_per_node)),
                gpu_memory_gib=self.gpu_memory_gib,
            )
            for i in range(self.nodes)
        )

    def describe(self) -> str:
        return f"{self.nodes} × {self.gpus_per_node}×{self.gpu_type}"
