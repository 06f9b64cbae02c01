"""What each allocation is charged, and so how allocations rank by fair share.

An allocation's charge is its usage in the last ``UsageSnapshot`` (folded from
the log by the projector), plus what its running allocated work and the serving
GPUs held for it (``ServingHeld``) used since, counted ``running_horizon_s`` ahead
so that a pass's own placements weigh at once. GPU-seconds are priced by GPU type
(``PolicyConfig.price``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from libs.core.budget_tree import BudgetTree
from libs.core.capacity import Capacity
from libs.core.config import PolicyConfig
from libs.core.contract import Reclaims, borrows
from libs.core.decisions import ServingHeld, ServingReleased
from libs.core.fairshare import Standing, leaf_order, standings
from libs.core.ids import JobId, NodeId
from libs.core.model import JobSpec
from libs.core.running import Running, Tasks
from libs.core.state import Cell, State, Table


class Snapshot(NamedTuple):
    at: float
    usage: dict[str, float]  # charged GPU-seconds per allocation; never changed in place


class ServingCharge(NamedTuple):
    """A serving GPU's charge: to whom, since when, at what price per GPU-second."""

    allocation: str
    since: float
    price: float


class Charges:
    DERIVED = ("_entitlements",)

    def __init__(self, config: PolicyConfig, state: State, capacity: Capacity) -> None:
        self.config = config
        self._capacity = capacity  # its nodes' GPU types price running work
        self._tree: Cell[BudgetTree | None] = state.cell("tree", None, _tree_fact)
        self._snapshot = state.cell("usage", Snapshot(0.0, {}), _snapshot_fact)
        # Per allocation: allocated running GPUs (priced), and the sum of gpus × max(placed,
        # snapshot time): usage since the snapshot in O(allocations). Float sums depend
        # on the order of the terms, so they are state, not a cache.
        self._tally: Table[str, tuple[float, float]] = state.table("tally")
        # The serving GPUs held (``ServingHeld``): each charged as a running GPU is.
        self._serving_charges: Table[tuple[NodeId, int], ServingCharge] = state.table(
            "serving.charged"
        )
        self._entitlements: dict[str, float] = {}  # of the tree (``derived`` rebuilds it)
        # The last rank, with all it was computed from (every pass ranks; several
        # inputs often share a clock and a tally).
        self._ranked: tuple[tuple[object, ...], dict[str, int]] = ((), {})
        # A memo, not state: each running job's priced GPUs with the tasks they price, for
        # the capacity's ``generation`` (node types price them): a snapshot reads them all.
        self._prices: tuple[int, dict[JobId, tuple[Tasks, float]]] = (-1, {})

    def set_tree(self, tree: BudgetTree) -> None:
        self._tree.value = tree
        self._entitlements = tree.entitlements()

    def snapshot(self, at: float, usage: dict[str, float], running: Iterable[Running]) -> None:
        """A new usage snapshot holds what ran before it: count running work from it on."""
        snapshot = self._snapshot.value = Snapshot(at, usage)
        weighted_start = dict.fromkeys(self._tally, 0.0)
        for run in running:
            if run.spec.allocated:
                start = max(run.placed_at, snapshot.at)
                weighted_start[run.spec.allocation] += self._priced_run(run) * start
        for charge in self._serving_charges.values():
            weighted_start[charge.allocation] += charge.price * max(charge.since, snapshot.at)
        for allocation, weighted in weighted_start.items():
            self._tally[allocation] = (self._tally[allocation][0], weighted)

    def count(self, run: Running, sign: int) -> None:
        """Add (+1) or remove (-1) an allocated job's GPUs from its allocation's tally."""
        if not run.spec.allocated:
            return
        priced = self._priced_run(run)
        if sign < 0:
            self._prices[1].pop(run.job_id, None)  # it no longer runs
        self._add(run.spec.allocation, priced * sign, run.placed_at)

    def serving(self, change: ServingHeld | ServingReleased, now: float) -> None:
        """Serving took a GPU, moved its charge, or gave it back: charge it from now to
        the allocation it is held for, as the ledger does."""
        key = (change.node_id, change.gpu_index)
        old = self._serving_charges.pop(key)
        if old is not None:
            self._add(old.allocation, -old.price, old.since)
        if isinstance(change, ServingHeld):
            price = self.price_of(change.node_id)
            self._serving_charges[key] = ServingCharge(change.allocation, now, price)
            self._add(change.allocation, price, now)

    def _add(self, allocation: str, gpus: float, since: float) -> None:
        """Add priced running ``gpus`` (negative: remove them) running since ``since``."""
        running, weighted_start = self._tally.get(allocation) or (0.0, 0.0)
        start = max(since, self._snapshot.value.at)
        running, weighted_start = running + gpus, weighted_start + gpus * start
        if abs(running) < 1e-9:  # float sums: nothing left runs
            self._tally.pop(allocation)
        else:
            self._tally[allocation] = (running, weighted_start)

    def rank(self, now: float) -> dict[str, int]:
        """Each allocation's place in the fair-share order, 0 first."""
        tree = self._tree.value
        if tree is None:
            return {}
        key = (now, tree, self._snapshot.value, *self._tally.items())
        if self._ranked[0] != key:
            order = leaf_order(tree, self._usage(now), self._entitlements)
            self._ranked = key, {leaf: i for i, leaf in enumerate(order)}
        return self._ranked[1]

    def standings(self, now: float) -> dict[str, Standing]:
        tree = self._tree.value
        if tree is None:
            return {}
        return standings(tree, self._usage(now), self._entitlements)

    def derived(self) -> dict[str, object]:
        tree = self._tree.value
        return {"_entitlements": {} if tree is None else tree.entitlements()}

    def _usage(self, now: float) -> dict[str, float]:
        """Charged usage per allocation: the last snapshot plus what ran since,
        plus running work counted ``running_horizon_s`` ahead."""
        usage = dict(self._snapshot.value.usage)
        until = now + self.config.running_horizon_s
        for allocation, (gpus, weighted_start) in self._tally.items():
            accrued = gpus * until - weighted_start
            usage[allocation] = usage.get(allocation, 0.0) + accrued
        return usage

    def borrows(self, spec: JobSpec, tasks: Tasks) -> bool:
        """Whether work placed on ``tasks`` would run beyond its allocation's share of
        the cluster (``contract.borrows``), in priced GPUs."""
        holding = self._holding(spec.allocation) + self._priced(tasks)
        return borrows(spec, holding, self._entitled(spec.allocation))

    def reclaims(self, spec: JobSpec) -> Reclaims:
        """Whose borrowed GPUs the job may take back: anyone's if, placed on the cheapest
        GPUs it may use, it would stay within its allocation's share; else only those of
        allocations further beyond theirs than it would be (so no two jobs take the same
        GPUs from each other in turn)."""
        price = self.config.price(spec.gpu_type)
        if self.config.gpu_prices and not spec.gpu_type:
            price = min(self.config.price(n.gpu_type) for n in self._capacity.nodes.values())
        holding = self._holding(spec.allocation) + spec.gpus * price
        entitled = self._entitled(spec.allocation)
        if not borrows(spec, holding, entitled):
            return None
        beyond = holding - entitled
        return frozenset(a for a in self._tally if self.beyond_share(a) > beyond * (1 + 1e-9))

    def beyond_share(self, allocation: str) -> float:
        """What the allocation holds beyond its share of the cluster now (running work
        and serving GPUs, priced; negative when below): borrowed."""
        return self._holding(allocation) - self._entitled(allocation)

    def _holding(self, allocation: str) -> float:
        return (self._tally.get(allocation) or (0.0, 0.0))[0]

    def _entitled(self, allocation: str) -> float:
        """The allocation's share of the cluster, in priced GPUs."""
        total: float = self._capacity.total_gpus
        if self.config.gpu_prices:
            price = self.config.price
            total = sum(n.gpu_count * price(n.gpu_type) for n in self._capacity.nodes.values())
        return self._entitlements.get(allocation, 0.0) * total

    def _priced_run(self, run: Running) -> float:
        """``_priced(run.tasks)``, remembered while the job's tasks and the nodes stay."""
        generation, prices = self._prices
        if generation != self._capacity.generation:
            prices = {}
            self._prices = (self._capacity.generation, prices)
        known = prices.get(run.job_id)
        if known is not None and known[0] is run.tasks:
            return known[1]
        priced = self._priced(run.tasks)
        prices[run.job_id] = (run.tasks, priced)
        return priced

    def _priced(self, tasks: Tasks) -> float:
        return sum(len(g) * self.price_of(n) for n, g in tasks.values())

    def price_of(self, node_id: NodeId) -> float:
        """One GPU-second on the node, by its GPU type (a node gone: the default price)."""
        node = self._capacity.nodes.get(node_id)
        return self.config.price(node.gpu_type if node is not None else "")


def _snapshot_fact(snapshot: Snapshot) -> str:
    return f"{snapshot.at}|{sorted(snapshot.usage.items())}"


def _tree_fact(tree: BudgetTree | None) -> str:
    if tree is None:
        return ""
    return "|".join(
        f"{n.name}:{n.parent}:{n.weight}" for n in sorted(tree.nodes, key=lambda n: n.name)
    )
