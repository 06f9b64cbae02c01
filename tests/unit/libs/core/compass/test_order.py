"""The order in which a planner takes GPUs that tie."""

from __future__ import annotations

from libs.core.compass.order import GpuOrder

IDS = [f"n{i:04d}/0" for i in range(64)]


def test_one_planner_takes_the_lowest_id_first() -> None:
    assert sorted(IDS, key=GpuOrder().key) == IDS


def test_each_named_planner_has_an_order_of_its_own_and_the_same_one_every_time() -> None:
    orders = {name: sorted(IDS, key=GpuOrder(name).key) for name in ("p0", "p1", "p2", "p3")}
    assert len({order[0] for order in orders.values()}) > 1
    assert all(sorted(order) == IDS for order in orders.values())  # every GPU, once
    assert sorted(IDS, key=GpuOrder("p2").key) == orders["p2"]
