"""Fair-share order (``libs/core/fairshare.py``): who goes next, level by level."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.core.budget_tree import BudgetNode, BudgetTree
from libs.core.fairshare import Standing, leaf_order, standings
from libs.core.usage import WindowedUsage
from tests.builders import tree

HOUR = 3600.0

# root ── vision (w 1) ── det (w 1), gen (w 1)
#      └─ nlp (w 1)
LAB = BudgetTree(
    (
        BudgetNode("root"),
        BudgetNode("vision", "root"),
        BudgetNode("nlp", "root"),
        BudgetNode("det", "vision"),
        BudgetNode("gen", "vision"),
    )
)


def test_siblings_go_in_order_of_usage_divided_by_weight() -> None:
    # a: 30 / 3 = 10, b: 20 / 1 = 20, c: 5 / 1 = 5
    order = leaf_order(tree(a=3, b=1, c=1), {"a": 30.0, "b": 20.0, "c": 5.0})
    assert order == ["c", "a", "b"]


def test_a_heavier_weight_earns_more_usage_before_it_falls_behind() -> None:
    # Equal usage: the heavier sibling is further below its entitlement.
    assert leaf_order(tree(a=1, b=2), {"a": 10.0, "b": 10.0}) == ["b", "a"]
    # b may use up to twice what a used before it falls behind; a tie goes by name.
    assert leaf_order(tree(a=1, b=2), {"a": 10.0, "b": 19.9}) == ["b", "a"]
    assert leaf_order(tree(a=1, b=2), {"a": 10.0, "b": 20.1}) == ["a", "b"]
    assert leaf_order(tree(a=2, b=1), {"a": 20.0, "b": 10.0}) == ["a", "b"]  # a tie


def test_equal_shares_are_broken_by_name_whatever_the_tree_order() -> None:
    assert leaf_order(tree(c=1, a=1, b=1), {}) == ["a", "b", "c"]
    assert leaf_order(tree(c=2, a=2, b=2), dict.fromkeys("abc", 7.0)) == ["a", "b", "c"]


def test_below_their_entitlement_first_then_the_rest_level_by_level() -> None:
    # Entitlements: det 25 %, gen 25 %, nlp 50 %. det (0 %) and nlp (37.5 %) are below
    # theirs and go first, furthest below first; gen (62.5 %) is over.
    order = leaf_order(LAB, {"det": 0.0, "gen": 100.0, "nlp": 60.0})
    assert order == ["det", "nlp", "gen"]
    # Only det is below: of the rest, vision as a whole (50) used less than nlp (110),
    # so gen goes before nlp (Slurm's Fair Tree): an idle team's share goes first to
    # its siblings, though gen (31 %) is further over its 25 % than nlp (69 %) over 50 %.
    assert leaf_order(LAB, {"det": 0.0, "gen": 50.0, "nlp": 110.0}) == ["det", "gen", "nlp"]


def test_a_team_below_its_entitlement_goes_before_another_programs_catch_up() -> None:
    # research (50 %) is below its share as a whole (40 %), but language (30 %) is
    # above its own 25 %; ads (5 %) is below its 10 %: under Fair Tree alone language
    # would go first, and ads would wait while language catches up on speech's idle share.
    lab = BudgetTree(
        (
            BudgetNode("root"),
            BudgetNode("research", "root"),
            BudgetNode("product", "root"),
            BudgetNode("language", "research"),
            BudgetNode("speech", "research"),
            BudgetNode("ranking", "product", weight=4),
            BudgetNode("ads", "product"),
        )
    )
    usage = {"language": 30.0, "speech": 10.0, "ranking": 55.0, "ads": 5.0}
    order = leaf_order(lab, usage)
    assert order.index("ads") < order.index("language")
    assert order[:2] == ["speech", "ads"]  # at 0.4 and 0.5 of theirs: furthest below first


def test_usage_of_allocations_outside_the_tree_is_ignored() -> None:
    assert leaf_order(tree(a=1, b=1), {"a": 5.0, "gone": 1e12}) == ["b", "a"]


def test_usage_that_left_the_lookback_window_no_longer_counts() -> None:
    usage = WindowedUsage(window_s=24 * HOUR)
    usage.start("old/0", "a", 8, allocated=True, at=0.0)  # a ran a lot, long ago
    usage.end("old/0", 10 * HOUR)
    usage.start("new/0", "b", 1, allocated=True, at=30 * HOUR)  # b ran a little, lately
    usage.end("new/0", 31 * HOUR)
    teams = tree(a=1, b=1)

    def charged(at: float) -> dict[str, float]:
        return {k: u.allocated_gpu_s for k, u in usage.snapshot(at).items()}

    assert leaf_order(teams, charged(31 * HOUR)) == ["b", "a"]  # a's last 3 h in the window count
    assert charged(40 * HOUR) == {"a": 0.0, "b": HOUR}
    assert leaf_order(teams, charged(40 * HOUR)) == ["a", "b"]  # they left the window


def test_standing_is_the_share_of_usage_over_the_entitlement() -> None:
    teams = tree(a=3, b=1)  # entitled to 0.75 and 0.25
    result = standings(teams, {"a": 50.0, "b": 50.0}, teams.entitlements())
    assert result == {
        "a": Standing(rank=1, of=2, ratio=pytest.approx(0.5 / 0.75)),  # type: ignore[arg-type]
        "b": Standing(rank=2, of=2, ratio=2.0),
    }


def test_with_no_usage_at_all_every_ratio_is_zero() -> None:
    teams = tree(a=3, b=1)
    result = standings(teams, {}, teams.entitlements())
    assert [(k, s.rank, s.ratio) for k, s in sorted(result.items())] == [
        ("a", 1, 0.0),
        ("b", 2, 0.0),
    ]


def test_any_use_of_an_entitlement_that_rounds_to_zero_is_infinitely_over_it() -> None:
    teams = tree(a=1, b=1)
    result = standings(teams, {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 0.0})
    assert result["a"].ratio == math.inf
    assert result["b"].ratio == 0.0


# -- properties ----------------------------------------------------------------


@st.composite
def trees_and_usage(draw: st.DrawFn) -> tuple[BudgetTree, dict[str, float]]:
    """A random tree (each node's parent drawn among the earlier ones) and leaf usage."""
    size = draw(st.integers(1, 12))
    nodes = [BudgetNode("n0")]
    for i in range(1, size):
        parent = draw(st.integers(0, i - 1))
        weight = draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0]))
        nodes.append(BudgetNode(f"n{i}", f"n{parent}", weight))
    budget = BudgetTree(tuple(nodes))
    usage = {
        leaf: float(draw(st.sampled_from([0, 0, 1, 10, 10, 1000]))) for leaf in budget.leaves()
    }
    return budget, usage


@given(trees_and_usage())
def test_the_order_is_a_permutation_of_the_leaves(
    case: tuple[BudgetTree, dict[str, float]],
) -> None:
    budget, usage = case
    order = leaf_order(budget, usage)
    assert sorted(order) == budget.leaves()
    assert len(set(order)) == len(order)


@given(trees_and_usage())
def test_entitlements_sum_to_one_and_ranks_count_from_one(
    case: tuple[BudgetTree, dict[str, float]],
) -> None:
    budget, usage = case
    entitled = budget.entitlements()
    assert sum(entitled.values()) == pytest.approx(1.0)
    result = standings(budget, usage, entitled)
    assert sorted(s.rank for s in result.values()) == list(range(1, len(entitled) + 1))
    assert {s.of for s in result.values()} == {len(entitled)}
    used = sum(usage.values())
    if used:  # the ratios, weighted by entitlement, are the usage shares: they sum to 1
        assert sum(s.ratio * entitled[k] for k, s in result.items()) == pytest.approx(1.0)


@given(trees_and_usage())
def test_the_order_does_not_depend_on_the_order_nodes_are_listed(
    case: tuple[BudgetTree, dict[str, float]],
) -> None:
    budget, usage = case
    reversed_tree = BudgetTree(tuple(reversed(budget.nodes)))
    shuffled_usage = dict(reversed(list(usage.items())))
    assert leaf_order(reversed_tree, shuffled_usage) == leaf_order(budget, usage)


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 100), min_size=1))
def test_in_a_flat_tree_of_equal_weights_less_usage_goes_first(usage: dict[str, int]) -> None:
    flat = tree(**dict.fromkeys("abcdef", 1.0))
    order = leaf_order(flat, {k: float(v) for k, v in usage.items()})
    assert order == sorted("abcdef", key=lambda k: (usage.get(k, 0), k))
