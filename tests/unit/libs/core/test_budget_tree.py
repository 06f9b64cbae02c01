from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.config.budget import tree_from_mapping
from libs.core.budget_tree import BudgetNode, BudgetTree, InvalidTree

LAB = {
    "name": "lab",
    "managers": ["carol"],
    "children": [
        {
            "name": "vision",
            "weight": 60,
            "managers": ["dana"],
            "children": [
                {"name": "det", "weight": 35, "members": ["alice"]},
                {"name": "gen", "weight": 65, "members": ["erin", "alice"]},
            ],
        },
        {"name": "nlp", "weight": 40, "members": ["bob"]},
    ],
}


def test_entitlement_is_the_product_of_shares_down_the_tree() -> None:
    shares = tree_from_mapping(LAB).entitlements()
    assert shares == pytest.approx({"det": 0.21, "gen": 0.39, "nlp": 0.40})


def test_members_and_managers() -> None:
    tree = tree_from_mapping(LAB)
    assert tree.allocations_of("alice") == ["det", "gen"]
    assert tree.can_manage("dana", "det") and tree.can_manage("carol", "det")
    assert not tree.can_manage("dana", "nlp")


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (
            (BudgetNode("r"), BudgetNode("a", "r", weight=0)),
            "a: weight must be > 0 and at most 1,000,000,000, got 0",
        ),
        ((BudgetNode("r"), BudgetNode("a", "ghost")), "a: unknown parent 'ghost'"),
        ((BudgetNode("r"), BudgetNode("r", "r")), "r: duplicate name"),
        ((BudgetNode("r"), BudgetNode("a", "b"), BudgetNode("b", "a")), "a: part of a cycle"),
        ((BudgetNode("r"), BudgetNode("s")), "exactly one root, found 2"),
    ],
)
def test_invalid_trees_are_refused_naming_the_node(
    nodes: tuple[BudgetNode, ...], message: str
) -> None:
    with pytest.raises(InvalidTree, match=message):
        BudgetTree(nodes)


@given(st.lists(st.floats(0.01, 1000), min_size=1, max_size=8), st.integers(1, 5))
def test_entitlements_sum_to_one(weights: list[float], fanout: int) -> None:
    children = [
        {"name": f"p{i}", "weight": w, "children": [{"name": f"p{i}-t{j}"} for j in range(fanout)]}
        for i, w in enumerate(weights)
    ]
    shares = tree_from_mapping({"name": "root", "children": children}).entitlements()
    assert math.isclose(sum(shares.values()), 1.0)
