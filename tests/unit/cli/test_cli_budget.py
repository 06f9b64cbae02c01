"""`qm budget set` changes only what it names of a node, and says what changed;
`qm budget usage` shows owed against delivered hours."""

from __future__ import annotations

from qm.v1 import budget_service_pb2, types_pb2

from cli import render
from cli.budget import NodeEdit, changes, edited_node
from libs.events.wire_time import duration
from tests.unit.cli.conftest import text

VISION = types_pb2.BudgetNode(
    name="vision", parent="lab", weight=60, members=["alice", "eve"], managers=["dana"]
)


def test_a_new_weight_keeps_the_members_and_managers() -> None:
    node = edited_node(VISION, "vision", NodeEdit(weight=30))
    assert (node.parent, node.weight, list(node.members), list(node.managers)) == (
        "lab", 30, ["alice", "eve"], ["dana"],
    )  # fmt: skip
    assert VISION.weight == 60, "the node read is left as it was"


def test_members_are_added_removed_or_replaced() -> None:
    added = edited_node(VISION, "vision", NodeEdit(add_members=["bob", "alice"]))
    assert list(added.members) == ["alice", "eve", "bob"]
    removed = edited_node(VISION, "vision", NodeEdit(remove_members=["eve"], add_managers=["x"]))
    assert (list(removed.members), list(removed.managers)) == (["alice"], ["dana", "x"])
    replaced = edited_node(VISION, "vision", NodeEdit(members=["zed"]))
    assert list(replaced.members) == ["zed"] and replaced.weight == 60


def test_a_new_node_takes_what_it_is_given_and_weight_one() -> None:
    node = edited_node(None, "nlp", NodeEdit(parent="lab", members=["bob"]))
    assert (node.name, node.parent, node.weight, list(node.members)) == ("nlp", "lab", 1, ["bob"])


def test_a_change_is_said_field_by_field() -> None:
    edited = edited_node(VISION, "vision", NodeEdit(weight=30, add_members=["bob"]))
    edited.members.remove("eve")
    assert changes(VISION, edited) == ["weight: 60 -> 30", "members: +bob, -eve"]
    moved = edited_node(VISION, "vision", NodeEdit(parent="other", remove_managers=["dana"]))
    assert changes(VISION, moved) == ["parent: lab -> other", "managers: -dana"]


def test_a_node_edited_to_what_it_is_has_no_changes() -> None:
    for edit in (NodeEdit(add_members=["alice"]), NodeEdit(weight=60), NodeEdit(parent="lab")):
        assert changes(VISION, edited_node(VISION, "vision", edit)) == []


def test_a_new_node_is_said_whole() -> None:
    node = edited_node(None, "nlp", NodeEdit(parent="lab", members=["bob"]))
    assert changes(None, node) == ["parent: lab", "weight: 1", "members: +bob"]


def test_usage_shows_the_share_of_owed_delivered_and_the_window() -> None:
    usage = budget_service_pb2.GetUsageResponse(
        window=duration(7 * 86400), covered=duration(2 * 3600), target_pct=97
    )
    usage.allocations.add(
        allocation="vision",
        entitlement=0.6,
        owed_gpu_hours=10,
        allocated_gpu_hours=8.5,
        unallocated_gpu_hours=1.25,
        delivered_pct=85,
    )
    usage.allocations.add(allocation="nlp", entitlement=0.4)  # nothing owed
    shown = text(render.usage_table(usage))
    assert "over the last 7d (the log covers 2h)" in shown
    vision = next(line for line in shown.splitlines() if "vision" in line)
    cells = [cell.strip() for cell in vision.split("│")[1:-1]]
    assert cells == ["vision", "60.0%", "10.00", "8.50", "1.25", "85.0%"]
    nlp = next(line for line in shown.splitlines() if "nlp" in line)
    assert nlp.split("│")[-2].strip() == "-"


def test_usage_leads_with_the_worst_team_over_the_floor_and_shows_small_teams_apart() -> None:
    usage = budget_service_pb2.GetUsageResponse(window=duration(86400), target_pct=97)
    usage.allocations.add(allocation="vision", owed_gpu_hours=10, delivered_pct=96)
    usage.allocations.add(allocation="tiny", owed_gpu_hours=0.001, delivered_pct=0, small=True)
    usage.headline.owed_delivered_min_pct = 96
    usage.headline.owed_delivered_weighted_pct = 95.99
    usage.headline.owed_small_teams.count = 1
    usage.headline.owed_small_teams.owed_pct = 0.01
    usage.headline.owed_small_teams.min_pct = 0
    shown = text(render.usage_table(usage))
    assert "worst team: 96.0%; weighted: 96.0%; small teams (owed under 0.1% of the" in shown
    assert "1, 0.01% of owed, worst 0.0%" in shown
    tiny = next(line for line in shown.splitlines() if "tiny" in line)
    assert tiny.split("│")[-2].strip() == "0.0% (small team)"
