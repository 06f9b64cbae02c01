"""The budget service's state: the current tree and the ledger, folded from the log."""

from __future__ import annotations

from dataclasses import dataclass, field

from qm.v1 import events_pb2, types_pb2

from libs.core.budget_tree import BudgetTree
from libs.core.config import PolicyConfig
from libs.core.usage import WindowedUsage
from libs.events import event_type, occurred_at
from libs.events.convert import tree_from_proto


@dataclass
class BudgetBook:
    tree: BudgetTree | None = None
    version: int = 0
    usage: WindowedUsage = field(
        default_factory=lambda: WindowedUsage(PolicyConfig().lookback_window_s)
    )
    _jobs: dict[str, types_pb2.JobSpec] = field(default_factory=dict)

    def apply(self, env: events_pb2.Envelope) -> None:
        at = occurred_at(env)
        match event_type(env):
            case "budget_changed":
                self.tree = tree_from_proto(env.budget_changed.tree)
                self.version = env.budget_changed.tree.version
            case "job_admitted":
                self._jobs[env.job_admitted.job_id] = env.job_admitted.spec
            case "task_started":
                started = env.task_started
                spec = self._jobs.get(started.job_id)
                if spec is not None:
                    self.usage.start(
                        started.task_id,
                        spec.allocation,
                        spec.gpus,
                        allocated=spec.min_runtime_s > 0,
                        at=at,
                    )
            case "task_finished":
                self.usage.end(env.task_finished.task_id, at)
            case "task_failed":
                self.usage.end(env.task_failed.task_id, at)
