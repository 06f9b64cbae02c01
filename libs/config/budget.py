"""The budget tree file (``deploy/local/budget.yaml``): nested nodes, each with its children.

``{name, weight, members, managers, children: [...]}``; ``weight`` is the node's share
among its siblings (default 1). The tree's own rules (one root, unique names) are the
core's, and reported against the file too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from libs.config.document import ConfigError, FileModel, read_document, validate
from libs.core.budget_tree import BudgetNode, BudgetTree, InvalidTree

Name = Annotated[str, Field(min_length=1)]


class BudgetNodeEntry(FileModel):
    name: Name
    weight: float = Field(1.0, gt=0)
    members: list[Name] = Field(default_factory=list)
    managers: list[Name] = Field(default_factory=list)
    children: list[BudgetNodeEntry] = Field(default_factory=list)

    def flattened(self, parent: str = "") -> list[BudgetNode]:
        node = BudgetNode(self.name, parent, self.weight, tuple(self.members), tuple(self.managers))
        return [node, *(n for child in self.children for n in child.flattened(self.name))]


def tree_from_mapping(raw: object, source: str = "the budget tree") -> BudgetTree:
    """The tree a parsed file describes; ``source`` names the file in errors."""
    entry = validate(BudgetNodeEntry, raw, source)
    try:
        return BudgetTree(tuple(entry.flattened()))
    except InvalidTree as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_budget_tree(path: Path) -> BudgetTree:
    return tree_from_mapping(read_document(path), str(path))
