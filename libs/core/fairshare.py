"""Fair-share order: which allocation's work goes next.

Siblings are compared level by level (as in Slurm's Fair Tree): at each node
of the budget tree, children are ordered by usage ÷ share (lower first), where
a child's usage is the sum over its subtree. The order of leaves is the
depth-first walk in that order, so a team below its entitlement goes before
its siblings, and a program below its entitlement goes before other programs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from libs.core.budget_tree import BudgetTree


@dataclass(frozen=True)
class Standing:
    """An allocation's place in the order, for explanations."""

    rank: int  # 1 = goes first
    of: int
    ratio: float  # its share of usage ÷ its entitlement: 1.0 = exactly what it is owed


def leaf_order(tree: BudgetTree, usage: Mapping[str, float]) -> list[str]:
    """Leaves, most under-served first. Unknown allocations in ``usage`` are ignored."""
    totals: dict[str, float] = {}
    children, weight = tree.children, tree.weight  # every pass ranks: names bound once

    def subtree_usage(name: str) -> float:
        total = totals[name] = usage.get(name, 0.0) + sum(map(subtree_usage, children(name)))
        return total

    def key(name: str) -> tuple[float, str]:
        return totals[name] / weight(name), name

    root = tree.root
    subtree_usage(root)
    order: list[str] = []
    stack = [root]
    while stack:
        name = stack.pop()
        kids = children(name)
        if kids:
            stack.extend(reversed(sorted(kids, key=key)))
        else:
            order.append(name)
    return order


def standings(
    tree: BudgetTree, usage: Mapping[str, float], entitlements: Mapping[str, float]
) -> dict[str, Standing]:
    order = leaf_order(tree, usage)
    total = sum(usage.get(leaf, 0.0) for leaf in order)
    return {
        leaf: Standing(
            rank=i + 1, of=len(order), ratio=_ratio(usage.get(leaf, 0.0), total, entitled)
        )
        for i, leaf in enumerate(order)
        for entitled in (entitlements[leaf],)
    }


def _ratio(used: float, total: float, entitled: float) -> float:
    """Its share of usage over its entitlement. An entitlement can round to 0 (a weight a
    billion times smaller than its siblings', several levels deep): any use is then
    infinitely over it."""
    if not total:
        return 0.0
    share = used / total
    return share / entitled if entitled else (math.inf if share else 0.0)
