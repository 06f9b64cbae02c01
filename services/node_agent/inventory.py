"""What a node offers: read from NVML on a GPU machine, or declared in a YAML file.

The declared file (``deploy/local/nodes.yaml``) is described in ``libs.config.inventory``.
Each node also says where other nodes reach it (``NodeInventory.address``): a multi-node
job's parts rendezvous there.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from qm.v1 import types_pb2

from libs.config.document import ConfigError, read_document, validate
from libs.config.inventory import DeclaredNode, InventoryFile, node_address

DEFAULT_INVENTORY = Path(__file__).resolve().parents[2] / "deploy" / "local" / "nodes.yaml"
# A declared node's address unless it or the agent names one: declared nodes are local or
# simulated, their parts all on this machine.
DECLARED_ADDRESS = "127.0.0.1"

EXECUTORS = {
    "process": types_pb2.EXECUTOR_PROCESS,
    "simulated": types_pb2.EXECUTOR_SIMULATED,
}

_GIB = 2**30
# Declared GPUs get stable made-up UUIDs, so re-registering a node changes nothing.
_UUID_NAMESPACE = uuid.UUID("6f1c2a1e-8a0e-4c3e-9a43-7d1f0c5b2e10")
# Words in NVML product names that say nothing about the model ("NVIDIA H100 80GB HBM3").
_BRANDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_SERIES = {"RTX", "GTX", "TITAN"}


class InventoryError(ConfigError):
    """The nodes cannot be known; the message says which and why."""


def load_inventory(path: Path, *, address: str = DECLARED_ADDRESS) -> list[types_pb2.NodeInventory]:
    """The declared nodes of an inventory file; a ``ConfigError`` names the file and key.
    ``address``: that of the nodes that declare none."""
    return parse_inventory(read_document(path), source=str(path), address=address)


def parse_inventory(
    raw: object, *, source: str, address: str = DECLARED_ADDRESS
) -> list[types_pb2.NodeInventory]:
    """Node inventories from a parsed YAML document (``source`` names it in errors);
    ``address``: that of the nodes that declare none."""
    return [_declared(node, address) for node in validate(InventoryFile, raw, source).nodes]


def select_nodes(
    nodes: Sequence[types_pb2.NodeInventory], wanted: Sequence[str]
) -> list[types_pb2.NodeInventory]:
    """The nodes named in ``wanted`` (all of them when it is empty), in inventory order."""
    known = {node.node_id for node in nodes}
    missing = [node_id for node_id in wanted if node_id not in known]
    if missing:
        raise InventoryError(
            f"node(s) {', '.join(missing)} not in the inventory; known: {', '.join(sorted(known))}"
        )
    return [node for node in nodes if not wanted or node.node_id in wanted]


def _declared(node: DeclaredNode, address: str) -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(
        node_id=node.node_id,
        cluster=node.cluster,
        executor=EXECUTORS[node.executor],
        workflows_only=node.workflows_only,
        source="declared",
        address=node.address or address,
        gpus=[
            types_pb2.Gpu(
                index=index,
                uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node.node_id}/{index}')}",
                type=node.gpu_type,
                memory_bytes=round(node.gpu_memory_gib * _GIB),
            )
            for index in range(node.gpu_count)
        ],
    )


class _MemoryInfo(Protocol):
    total: int


class Nvml(Protocol):
    """The part of ``pynvml`` the agent uses; tests hand in a fake."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetIndex(self, handle: object) -> int: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str: ...
    def nvmlDeviceGetName(self, handle: object) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _MemoryInfo: ...


def nvml_inventory(
    node_id: str,
    *,
    cluster: str,
    nvml: Nvml,
    workflows_only: bool = False,
    address: str | None = None,
) -> types_pb2.NodeInventory:
    """This machine's GPUs as NVML reports them; runs tasks as processes (``workflows_only``:
    workflow tasks only, a serving node); reached at ``address`` (default: this machine's
    fully qualified host name)."""
    if address is None:
        address = socket.getfqdn()
        try:
            node_address(address)
        except ValueError as exc:
            raise InventoryError(
                f"this machine's host name cannot be its address ({exc}): give --address"
            ) from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise InventoryError(
            f"NVML is not available ({exc}); on a machine without NVIDIA GPUs and driver, "
            "declare the node in an inventory file (--nodes) instead of using --nvml"
        ) from exc
    try:
        gpus = []
        for position in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(position)
            gpus.append(
                types_pb2.Gpu(
                    index=nvml.nvmlDeviceGetIndex(handle),
                    uuid=nvml.nvmlDeviceGetUUID(handle),
                    type=gpu_type_from_name(nvml.nvmlDeviceGetName(handle)),
                    memory_bytes=nvml.nvmlDeviceGetMemoryInfo(handle).total,
                )
            )
    except nvml.NVMLError as exc:
        raise InventoryError(f"NVML failed while listing GPUs: {exc}") from exc
    finally:
        nvml.nvmlShutdown()
    if not gpus:
        raise InventoryError("NVML reports no GPUs on this machine")
    return types_pb2.NodeInventory(
        node_id=node_id,
        cluster=cluster,
        gpus=gpus,
        executor=types_pb2.EXECUTOR_PROCESS,
        workflows_only=workflows_only,
        source="nvml",
        address=address,
    )


def gpu_type_from_name(name: str) -> str:
    """The short model name jobs ask for: "NVIDIA H100 80GB HBM3" -> "H100".

    "NVIDIA A100-SXM4-80GB" -> "A100", "NVIDIA GeForce RTX 4090" -> "RTX 4090".
    """
    words = [word for word in name.split() if word.upper() not in _BRANDS]
    if not words:
        return name.strip()
    if words[0].upper() in _SERIES and len(words) > 1:
        return f"{words[0]} {words[1].split('-')[0]}"
    return words[0].split("-")[0]
