"""`qm budget set` changes only what it names of a node."""

from __future__ import annotations

from qm.v1 import types_pb2

from cli.budget import NodeEdit, edited_node

TREE = types_pb2.BudgetTree(
    version=7,
    nodes=[
        types_pb2.BudgetNode(name="lab", managers=["carol"]),
        types_pb2.BudgetNode(
            name="vision", parent="lab", weight=60, members=["alice", "eve"], managers=["dana"]
        ),
    ],
)


def test_a_new_weight_keeps_the_members_and_managers() -> None:
    node = edited_node(TREE, "vision", NodeEdit(weight=30))
    assert (node.parent, node.weight, list(node.members), list(node.managers)) == (
        "lab", 30, ["alice", "eve"], ["dana"],
    )  # fmt: skip


def test_members_are_added_removed_or_replaced() -> None:
    added = edited_node(TREE, "vision", NodeEdit(add_members=["bob", "alice"]))
    assert list(added.members) == ["alice", "eve", "bob"]
    removed = edited_node(TREE, "vision", NodeEdit(remove_members=["eve"], add_managers=["x"]))
    assert (list(removed.members), list(removed.managers)) == (["alice"], ["dana", "x"])
    replaced = edited_node(TREE, "vision", NodeEdit(members=["zed"]))
    assert list(replaced.members) == ["zed"] and replaced.weight == 60


def test_a_new_node_takes_what_it_is_given_and_weight_one() -> None:
    node = edited_node(TREE, "nlp", NodeEdit(parent="lab", members=["bob"]))
    assert (node.name, node.parent, node.weight, list(node.members)) == ("nlp", "lab", 1, ["bob"])
    assert "nlp" not in {n.name for n in TREE.nodes}, "the tree read is left as it was"
