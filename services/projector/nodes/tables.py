"""Node id -> serialized ``qm.v1.Node``."""

from __future__ import annotations

from collections.abc import Iterator

from qm.v1 import types_pb2

from services.projector.app import TOPICS, protobuf_table

nodes = protobuf_table("nodes", TOPICS.nodes_view)


def get_node(node_id: str) -> types_pb2.Node | None:
    data = nodes.get(node_id)
    return None if data is None else types_pb2.Node.FromString(data)


def put_node(node: types_pb2.Node) -> None:
    """Store a node; only from the nodes agent (a table is written by one agent)."""
    nodes[node.inventory.node_id] = node.SerializeToString(deterministic=True)


def all_nodes() -> Iterator[types_pb2.Node]:
    return (types_pb2.Node.FromString(data) for data in list(nodes.values()))
