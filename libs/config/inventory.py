"""The declared node inventory (``deploy/local/nodes.yaml``, ``QM_NODES``): nodes without NVML.

Each node under ``nodes:`` has ``node_id``, ``gpu_type``, ``gpu_count`` and
``gpu_memory_gib``, and optionally ``cluster``, ``executor`` (``process`` or
``simulated``), ``workflows_only`` (a serving node: it takes workflow tasks, never a
batch job) and ``address`` (where other nodes reach it: ``node_address``; the agent's
default when absent). Node ids are unique.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from libs.config.document import FileModel
from libs.events.envelope import DEFAULT_CLUSTER

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]

MAX_ADDRESS_CHARS = 253  # the longest DNS name


def node_address(value: str) -> str:
    """``value`` if it can be a node's address (a host name or IP: it goes into other
    nodes' tasks' environments and hostfiles, one word each), else a ``ValueError``
    saying why."""
    if not value:
        raise ValueError("expected a host name or IP address, got an empty one")
    if len(value) > MAX_ADDRESS_CHARS:
        raise ValueError(
            f"expected at most {MAX_ADDRESS_CHARS} characters, got {len(value)}: {value[:40]!r}..."
        )
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"expected no whitespace or control characters, got {value!r}")
    return value


NodeAddress = Annotated[str, AfterValidator(node_address)]


class DeclaredNode(FileModel):
    node_id: Text
    gpu_type: Text
    gpu_count: Annotated[int, Field(ge=1)]
    gpu_memory_gib: Annotated[float, Field(gt=0)]
    cluster: Text = DEFAULT_CLUSTER
    executor: Literal["process", "simulated"] = "process"
    workflows_only: bool = False
    address: NodeAddress | None = None


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
