"""The budget service's state: the current tree and the ledger, folded from the log."""

from __future__ import annotations

from dataclasses import dataclass, field

from qm.v1 import events_pb2, types_pb2

from libs.core.budget_tree import BudgetNode, BudgetTree
from libs.core.usage import UsageLedger
from libs.events import event_type, occurred_at


@dataclass
class BudgetBook:
    tree: BudgetTree | None = None
    version: int = 0
    ledger: UsageLedger = field(default_factory=UsageLedger)

    def apply(self, env: events_pb2.Envelope) -> None:
        at = occurred_at(env)
        match event_type(env):
            case "budget_changed":
                self.tree = tree_from_proto(env.budget_changed.tree)
                self.version = env.budget_changed.tree.version
            case "job_admitted":
                spec = env.job_admitted.spec
                self.ledger.job(
                    env.job_admitted.job_id,
                    spec.allocation,
                    spec.gpus,
                    allocated=spec.min_runtime_s > 0,
                )
            case "task_started":
                self.ledger.started(env.task_started.job_id, env.task_started.task_id, at)
            case "task_finished":
                self.ledger.ended(env.task_finished.task_id, at)
            case "task_failed":
                self.ledger.ended(env.task_failed.task_id, at)


def tree_from_proto(tree: types_pb2.BudgetTree) -> BudgetTree:
    return BudgetTree(tuple(node_from_proto(n) for n in tree.nodes))


def node_from_proto(node: types_pb2.BudgetNode) -> BudgetNode:
    return BudgetNode(
        name=node.name,
        parent=node.parent,
        weight=node.weight,
        members=tuple(node.members),
        managers=tuple(node.managers),
    )


def tree_to_proto(tree: BudgetTree, version: int) -> types_pb2.BudgetTree:
    return types_pb2.BudgetTree(
        version=version,
        nodes=[
            types_pb2.BudgetNode(
                name=n.name,
                parent=n.parent,
                weight=n.weight,
                members=list(n.members),
                managers=list(n.managers),
            )
            for n in tree.nodes
        ],
    )
