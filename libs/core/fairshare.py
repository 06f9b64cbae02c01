"""Fair-share order: which allocation's work goes next.

An allocation's entitlement (its share of the cluster: the product of the
weights down the tree) is a guarantee: allocations whose share of the usage is
below it go first, the furthest below first. The rest share what is left over
level by level (as in Slurm's Fair Tree): at each node of the budget tree,
children are ordered by usage ÷ share (lower first), where a child's usage is
the sum over its subtree, and the leaves follow the depth-first walk in that
order, so a program below its share (an idle team's siblings) goes before other
programs. Fair Tree alone would let a team's siblings catch up on its idle share
while another program's team waits below its own entitlement.
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


def leaf_order(
    tree: BudgetTree,
    usage: Mapping[str, float],
    entitlements: Mapping[str, float] | None = None,
) -> list[str]:
    """Leaves, most under-served first. Unknown allocations in ``usage`` are ignored.
    ``entitlements`` are the tree's (``BudgetTree.entitlements``), if already known."""
    if entitlements is None:
        entitlements = tree.entitlements()
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
    # Below their entitlement first, the furthest below first (ties in walk order); then
    # the rest in walk order.
    total = sum(usage.get(leaf, 0.0) for leaf in order)
    below = sorted(
        (ratio, i)
        for i, leaf in enumerate(order)
        if entitlements.get(leaf, 0.0) > 0
        and (ratio := _ratio(usage.get(leaf, 0.0), total, entitlements[leaf])) < 1
    )
    first = [order[i] for _, i in below]
    rest = set(order) - set(first)
    return first + [leaf for leaf in order if leaf in rest]


def standings(
    tree: BudgetTree, usage: Mapping[str, float], entitlements: Mapping[str, float]
) -> dict[str, Standing]:
    order = leaf_order(tree, usage, entitlements)
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
