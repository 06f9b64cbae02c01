"""The declared node inventory (``deploy/local/nodes.yaml``, ``QM_NODES``): nodes without NVML.

Each node under ``nodes:`` has ``node_id``, ``gpu_type``, ``gpu_count`` and
``gpu_memory_gib``, and optionally ``cluster``, ``executor`` (``process`` or
``simulated``) and ``workflows_only`` (a serving node: it takes workflow tasks, never a
batch job). Node ids are unique.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from libs.config.document import FileModel
from libs.events.envelope import DEFAULT_CLUSTER

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class DeclaredNode(FileModel):
    node_id: Text
    gpu_type: Text
    gpu_count: Annotated[int, Field(ge=1)]
    gpu_memory_gib: Annotated[float, Field(gt=0)]
    cluster: Text = DEFAULT_CLUSTER
    executor: Literal["process", "simulated"] = "process"
    workflows_only: bool = False


class InventoryFile(FileModel):
    nodes: Annotated[list[DeclaredNode], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_ids(self) -> InventoryFile:
        first: dict[str, int] = {}
        for position, node in enumerate(self.nodes):
            if node.node_id in first:
                raise ValueError(
                    f"nodes[{position}].node_id: {node.node_id!r} is already declared at "
                    f"nodes[{first[node.node_id]}]"
                )
            first[node.node_id] = position
        return self
