"""The budget service's state: the current tree, the usage ledger and what each allocation
was owed and delivered, folded from the log."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from qm.v1 import events_pb2

from libs.core import PolicyConfig
from libs.core.budget_tree import BudgetTree, InvalidTree
from libs.events import event_type
from libs.events.convert import tree_from_proto
from libs.readmodels import UsageLedger
from libs.readmodels.delivery import DeliveryLedger


@dataclass
class BudgetBook:
    """The tree as last changed, the same usage ledger the projector keeps, and the
    console's owed and delivered GPU-hours (``qm budget usage``)."""

    ledger: UsageLedger
    delivery: DeliveryLedger
    tree: BudgetTree | None = None
    version: int = 0

    @classmethod
    def for_policy(cls, policy: PolicyConfig) -> BudgetBook:
        window = policy.lookback_window_s
        return cls(UsageLedger(window, policy.price), DeliveryLedger(window))

    def apply(self, env: events_pb2.Envelope) -> None:
        if event_type(env) == "budget_changed":
            # Only this service writes trees, valid ones; one that reached the log around
            # it is ignored here, as placement refuses it.
            changed = env.budget_changed.tree
            with contextlib.suppress(InvalidTree):
                self.adopt(tree_from_proto(changed), changed.version)
        self.ledger.apply(env)
        self.delivery.apply(env)

    def decided(self, env: events_pb2.Envelope) -> None:
        """Fold one of placement's decisions."""
        self.ledger.decided(env)
        self.delivery.apply(env)

    def adopt(self, tree: BudgetTree, version: int) -> None:
        """Take a tree unless the book already has a newer one: the service adopts its
        own change as soon as it is written, before its follower reads it back, so a
        change read late must not undo the one after it."""
        if version > self.version:
            self.tree, self.version = tree, version
