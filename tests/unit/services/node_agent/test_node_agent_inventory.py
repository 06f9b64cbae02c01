from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import types_pb2

from libs.config.document import ConfigError
from libs.config.inventory import node_address
from services.node_agent.inventory import (
    DECLARED_ADDRESS,
    DEFAULT_INVENTORY,
    InventoryError,
    gpu_type_from_name,
    load_inventory,
    nvml_inventory,
    parse_inventory,
    select_nodes,
)

GIB = 2**30


def parse(text: str, **options: str) -> list[types_pb2.NodeInventory]:
    return parse_inventory(yaml.safe_load(text), source="nodes.yaml", **options)


TWO_NODES = """
nodes:
  - {node_id: a, gpu_type: H100, gpu_count: 2, gpu_memory_gib: 80}
  - {node_id: b, cluster: west, gpu_type: A100, gpu_count: 1, gpu_memory_gib: 40.5,
     executor: simulated}
"""


def test_declared_nodes_get_gpus_and_defaults() -> None:
    a, b = parse(TWO_NODES)
    assert (a.node_id, a.cluster, a.executor, a.source) == (
        "a",
        "default",
        types_pb2.EXECUTOR_PROCESS,
        "declared",
    )
    assert [(g.index, g.type, g.memory_bytes) for g in a.gpus] == [
        (0, "H100", 80 * GIB),
        (1, "H100", 80 * GIB),
    ]
    assert (b.cluster, b.executor, b.gpus[0].memory_bytes) == (
        "west",
        types_pb2.EXECUTOR_SIMULATED,
        round(40.5 * GIB),
    )


def test_a_declared_nodes_address_is_its_own_else_the_agents() -> None:
    text = TWO_NODES.replace("gpu_count: 2,", "gpu_count: 2, address: gpu-a.example.org,")
    assert [node.address for node in parse(text)] == ["gpu-a.example.org", DECLARED_ADDRESS]
    assert [node.address for node in parse(text, address="10.1.2.3")] == [
        "gpu-a.example.org",
        "10.1.2.3",
    ]
    assert DECLARED_ADDRESS == "127.0.0.1"


def test_declared_gpu_uuids_are_unique_and_stable() -> None:
    uuids = [g.uuid for node in parse(TWO_NODES) for g in node.gpus]
    assert len(set(uuids)) == 3
    assert uuids == [g.uuid for node in parse(TWO_NODES) for g in node.gpus]


def test_local_stack_declares_four_h100_nodes_and_two_serving_nodes() -> None:
    nodes = load_inventory(DEFAULT_INVENTORY)
    batch, serving = nodes[:4], nodes[4:]
    assert [node.node_id for node in batch] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # Each its own loopback address: rank 0s on two of them may use the same port.
    assert [node.address for node in batch] == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    for node in batch:
        assert node.executor == types_pb2.EXECUTOR_PROCESS and not node.workflows_only
        assert [g.index for g in node.gpus] == list(range(8))
        assert {(g.type, g.memory_bytes) for g in node.gpus} == {("H100", 80 * GIB)}
    assert [node.node_id for node in serving] == ["serve-0", "serve-1"]
    for node in serving:  # simulated, so they take workflows only: nothing "runs" there
        assert node.executor == types_pb2.EXECUTOR_SIMULATED and node.workflows_only
        assert node.address == DECLARED_ADDRESS
        assert {(g.type, g.memory_bytes) for g in node.gpus} == {("T4", 15 * GIB)}


A = "node_id: a, gpu_type: H100"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: []", "nodes.yaml: nodes: expected at least 1 item(s), got []"),
        ("- a", 'nodes.yaml: expected a mapping, got ["a"]'),
        ("nodes: [plain]", 'nodes.yaml: nodes[0]: expected a mapping, got "plain"'),
        (
            "nodes: [{gpu_type: H100, gpu_count: 1, gpu_memory_gib: 8}]",
            "nodes.yaml: nodes[0].node_id: required",
        ),
        (f"nodes: [{{{A}, gpu_memory_gib: 80}}]", "nodes.yaml: nodes[0].gpu_count: required"),
        (
            f"nodes: [{{{A}, gpu_count: eight, gpu_memory_gib: 80}}]",
            'nodes[0].gpu_count: expected an integer, got "eight"',
        ),
        (
            f"nodes: [{{{A}, gpu_count: 0, gpu_memory_gib: 80}}]",
            "nodes[0].gpu_count: expected a number >= 1, got 0",
        ),
        (
            f"nodes: [{{{A}, gpu_count: true, gpu_memory_gib: 80}}]",
            "nodes[0].gpu_count: expected an integer, got true",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: -1}}]",
            "nodes[0].gpu_memory_gib: expected a number > 0, got -1",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: .nan}}]",
            "nodes[0].gpu_memory_gib: expected a finite number, got NaN",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, executor: docker}}]",
            "nodes[0].executor: expected one of 'process' or 'simulated', got \"docker\"",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, cluster: ''}}]",
            'nodes[0].cluster: expected at least 1 character(s), got ""',
        ),
        (
            f"nodes: [{{{A}, gpus: 8, gpu_count: 8, gpu_memory_gib: 80}}]",
            "nodes[0].gpus: unknown key; known keys: node_id, gpu_type, gpu_count,",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80}},"
            f" {{{A}, gpu_count: 8, gpu_memory_gib: 80}}]",
            "nodes[1].node_id: 'a' is already declared at nodes[0]",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, address: ''}}]",
            "nodes[0].address: expected a host name or IP address, got an empty one",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, address: 'gpu 0'}}]",
            "nodes[0].address: expected no whitespace or control characters, got 'gpu 0'",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, address: {'a' * 254}}}]",
            "nodes[0].address: expected at most 253 characters, got 254: 'aaaa",
        ),
        (
            f"nodes: [{{{A}, gpu_count: 8, gpu_memory_gib: 80, address: 10}}]",
            "nodes[0].address: expected a string, got 10",
        ),
    ],
)
def test_bad_inventories_name_the_node_and_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert message in str(caught.value)


@given(st.text(max_size=300))
def test_an_address_is_one_word_of_at_most_253_characters(text: str) -> None:
    fits = 0 < len(text) <= 253 and all(c.isprintable() and not c.isspace() for c in text)
    try:
        assert node_address(text) == text and fits
    except ValueError:
        assert not fits


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read: No such file"):
        load_inventory(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: line 2, column 1: not valid YAML"):
        load_inventory(broken)


def test_select_nodes_keeps_file_order_and_names_unknown_ids() -> None:
    nodes = load_inventory(DEFAULT_INVENTORY)
    assert [n.node_id for n in select_nodes(nodes, [])][:4] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [n.node_id for n in select_nodes(nodes, ["gpu-2", "gpu-0"])] == ["gpu-0", "gpu-2"]
    with pytest.raises(
        InventoryError,
        match=r"node\(s\) gpu-9 not in the inventory; known: gpu-0, gpu-1, gpu-2",
    ):
        select_nodes(nodes, ["gpu-1", "gpu-9"])


class FakeNvmlError(Exception):
    pass


@dataclass
class FakeMemory:
    total: int


class FakeNvml:
    NVMLError = FakeNvmlError

    def __init__(self, names: list[str], *, init_error: str = "") -> None:
        self.names = names
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return index

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        assert isinstance(handle, int)
        return handle

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle: object) -> str:
        assert isinstance(handle, int)
        return self.names[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> FakeMemory:
        return FakeMemory(total=80 * GIB)


def test_nvml_inventory_lists_the_gpus() -> None:
    nvml = FakeNvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    node = nvml_inventory("host-1", cluster="west", nvml=nvml)
    assert (node.node_id, node.cluster, node.source) == ("host-1", "west", "nvml")
    assert node.executor == types_pb2.EXECUTOR_PROCESS
    assert [(g.index, g.uuid, g.type, g.memory_bytes) for g in node.gpus] == [
        (0, "GPU-0", "H100", 80 * GIB),
        (1, "GPU-1", "H100", 80 * GIB),
    ]
    assert nvml.shut_down
    assert not node.workflows_only
    serving = nvml_inventory("host-2", cluster="west", nvml=nvml, workflows_only=True)
    assert serving.workflows_only


def test_an_nvml_node_is_reached_at_its_host_name_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml(["NVIDIA H100 80GB HBM3"])
    monkeypatch.setattr("socket.getfqdn", lambda: "gpu-7.cluster.example.org")
    assert nvml_inventory("gpu-7", cluster="west", nvml=nvml).address == (
        "gpu-7.cluster.example.org"
    )
    told = nvml_inventory("gpu-7", cluster="west", nvml=nvml, address="10.0.0.7")
    assert told.address == "10.0.0.7"
    monkeypatch.setattr("socket.getfqdn", lambda: "")
    with pytest.raises(
        InventoryError, match=r"host name cannot be its address \(.*\): give --address"
    ):
        nvml_inventory("gpu-7", cluster="west", nvml=nvml)


def test_nvml_absence_is_a_clear_error() -> None:
    nvml = FakeNvml([], init_error="NVML Shared Library Not Found")
    with pytest.raises(InventoryError, match=r"NVML is not available \(NVML Shared Library"):
        nvml_inventory("host-1", cluster="default", nvml=nvml)
    with pytest.raises(InventoryError, match="NVML reports no GPUs"):
        nvml_inventory("host-1", cluster="default", nvml=FakeNvml([]))


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA H200", "H200"),
    ],
)
def test_gpu_type_from_nvml_name(name: str, short: str) -> None:
    assert gpu_type_from_name(name) == short
