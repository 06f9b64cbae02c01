"""The policies the simulator can drive: anything that folds inputs into decisions."""

from __future__ import annotations

from typing import Protocol

from libs.core import Decision, Input, PolicyConfig, Scheduler
from libs.core.baselines import EasyPolicy, FifoPolicy, PriorityPolicy


class Policy(Protocol):
    def handle(self, event: Input) -> list[Decision]: ...


POLICIES = ("budget", "priority", "fifo", "easy")


def make_policy(name: str, config: PolicyConfig) -> Policy:
    """A fresh policy by name; ``budget`` is the core scheduler itself."""
    if name == "budget":
        return Scheduler(config)
    if name == "priority":
        return PriorityPolicy()
    if name == "fifo":
        return FifoPolicy()
    if name == "easy":
        return EasyPolicy()
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
