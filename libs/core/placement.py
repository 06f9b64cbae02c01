"""Where a job fits: first fit over nodes in a fixed order.

Returns a value, never raises: either the GPUs to use or a reason a person can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from libs.core.model import JobSpec, NodeSpec


@dataclass(frozen=True)
class Fit:
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class NoFit:
    reason: str


def first_fit(
    spec: JobSpec,
    nodes: Mapping[str, NodeSpec],
    free: Mapping[str, tuple[int, ...]],
) -> Fit | NoFit:
    """The first node (by id) of the right type with enough free GPUs.

    Takes the lowest free GPU indices so that the choice depends on nothing
    but the state.
    """
    largest_free = 0
    matching = 0
    for node_id in sorted(nodes):
        node = nodes[node_id]
        if spec.gpu_type and node.gpu_type != spec.gpu_type:
            continue
        if node.gpu_count < spec.gpus:
            continue
        matching += 1
        available = free.get(node_id, ())
        if len(available) >= spec.gpus:
            return Fit(node_id, available[: spec.gpus])
        largest_free = max(largest_free, len(available))
    wanted = f"{spec.gpus}×{spec.gpu_type or 'GPU'} on one node"
    if matching == 0:
        return NoFit(f"needs {wanted}; no registered node has that many")
    return NoFit(f"needs {wanted}; the largest free block is {largest_free}")
