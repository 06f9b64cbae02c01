"""What a node offers: read from NVML on a GPU machine, or declared in a YAML file.

The declared file (``deploy/local/nodes.yaml``) lists nodes under ``nodes:``, each with
``node_id``, ``gpu_type``, ``gpu_count``, ``gpu_memory_gib`` and optionally ``cluster``
(default ``default``) and ``executor`` (``process`` or ``simulated``; default ``process``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml
from qm.v1 import types_pb2

from libs.events.envelope import DEFAULT_CLUSTER

DEFAULT_INVENTORY = Path(__file__).resolve().parents[2] / "deploy" / "local" / "nodes.yaml"

EXECUTORS = {
    "process": types_pb2.EXECUTOR_PROCESS,
    "simulated": types_pb2.EXECUTOR_SIMULATED,
}

_REQUIRED = ("node_id", "gpu_type", "gpu_count", "gpu_memory_gib")
_FIELDS = (*_REQUIRED, "cluster", "executor")
_GIB = 2**30
# Declared GPUs get stable made-up UUIDs, so re-registering a node changes nothing.
_UUID_NAMESPACE = uuid.UUID("6f1c2a1e-8a0e-4c3e-9a43-7d1f0c5b2e10")
# Words in NVML product names that say nothing about the model ("NVIDIA H100 80GB HBM3").
_BRANDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_SERIES = {"RTX", "GTX", "TITAN"}


class InventoryError(ValueError):
    """The inventory cannot be read; the message names the node and field at fault."""


def load_inventory(path: Path) -> list[types_pb2.NodeInventory]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: not valid YAML: {exc}") from exc
    return parse_inventory(raw, source=str(path))


def parse_inventory(raw: object, *, source: str) -> list[types_pb2.NodeInventory]:
    """Turn a loaded YAML document into node inventories, or say what is wrong with it."""
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list) or not raw["nodes"]:
        raise InventoryError(f"{source}: expected a mapping with a non-empty list under 'nodes'")
    nodes: list[types_pb2.NodeInventory] = []
    first_seen: dict[str, int] = {}
    for position, entry in enumerate(raw["nodes"]):
        node = _parse_node(entry, source=source, position=position)
        if node.node_id in first_seen:
            raise InventoryError(
                f"{source}: node {node.node_id!r} (nodes[{position}]): duplicate node_id, "
                f"already declared at nodes[{first_seen[node.node_id]}]"
            )
        first_seen[node.node_id] = position
        nodes.append(node)
    return nodes


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


def _parse_node(entry: object, *, source: str, position: int) -> types_pb2.NodeInventory:
    where = f"{source}: nodes[{position}]"
    if not isinstance(entry, dict):
        raise InventoryError(f"{where}: expected a mapping of fields, got {entry!r}")
    node_id = entry.get("node_id")
    if not isinstance(node_id, str) or not node_id.strip():
        raise InventoryError(f"{where}: field 'node_id' is required and must be a non-empty string")
    node_id = node_id.strip()
    where = f"{source}: node {node_id!r} (nodes[{position}])"
    unknown = sorted(set(entry) - set(_FIELDS), key=str)
    if unknown:
        raise InventoryError(
            f"{where}: unknown field {unknown[0]!r}; known fields: {', '.join(_FIELDS)}"
        )
    for name in _REQUIRED:
        if name not in entry:
            raise InventoryError(f"{where}: field {name!r} is required")
    gpu_type = _string(entry, "gpu_type", where)
    cluster = _string(entry, "cluster", where, default=DEFAULT_CLUSTER)
    executor = _string(entry, "executor", where, default="process")
    if executor not in EXECUTORS:
        raise InventoryError(
            f"{where}: field 'executor' must be one of {', '.join(EXECUTORS)}, got {executor!r}"
        )
    count = entry["gpu_count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InventoryError(f"{where}: field 'gpu_count' must be an integer >= 1, got {count!r}")
    memory = entry["gpu_memory_gib"]
    if not isinstance(memory, int | float) or isinstance(memory, bool) or memory <= 0:
        raise InventoryError(
            f"{where}: field 'gpu_memory_gib' must be a number > 0, got {memory!r}"
        )
    return types_pb2.NodeInventory(
        node_id=node_id,
        cluster=cluster,
        executor=EXECUTORS[executor],
        source="declared",
        gpus=[
            types_pb2.Gpu(
                index=index,
                uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_id}/{index}')}",
                type=gpu_type,
                memory_bytes=round(memory * _GIB),
            )
            for index in range(count)
        ],
    )


def _string(entry: dict[Any, Any], name: str, where: str, *, default: str | None = None) -> str:
    value = entry.get(name, default)
    if not isinstance(value, str) or not value.strip():
        raise InventoryError(f"{where}: field {name!r} must be a non-empty string, got {value!r}")
    return value.strip()


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


def nvml_inventory(node_id: str, *, cluster: str, nvml: Nvml) -> types_pb2.NodeInventory:
    """This machine's GPUs as NVML reports them; runs tasks as processes."""
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
        source="nvml",
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
