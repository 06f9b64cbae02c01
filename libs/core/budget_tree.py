"""The budget tree: weights, members and managers. Pure; refuses invalid trees.

Its file form (nested nodes) is read by ``libs.config.budget``.

Each node's weight is its share among its siblings; a leaf's entitlement is
the product of its shares down from the root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from libs.core import limits as L


class InvalidTree(ValueError):
    """The tree breaks a rule; the message names the node."""


@dataclass(frozen=True)
class BudgetNode:
    name: str
    parent: str = ""
    weight: float = 1.0
    members: tuple[str, ...] = ()
    managers: tuple[str, ...] = ()


@dataclass(frozen=True)
class BudgetTree:
    nodes: tuple[BudgetNode, ...]
    _by_name: dict[str, BudgetNode] = field(init=False, repr=False, compare=False)
    _children: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, BudgetNode] = {}
        if len(self.nodes) > L.MAX_BUDGET_NODES:
            raise InvalidTree(f"at most {L.MAX_BUDGET_NODES} nodes, got {len(self.nodes)}")
        for node in self.nodes:
            _check(node)
            if node.name in by_name:
                raise InvalidTree(f"{node.name}: duplicate name")
            by_name[node.name] = node
        roots = [n.name for n in self.nodes if not n.parent]
        if len(roots) != 1:
            raise InvalidTree(f"the tree needs exactly one root, found {len(roots)}: {roots}")
        children: dict[str, list[str]] = {name: [] for name in by_name}
        for node in self.nodes:
            if node.parent:
                if node.parent not in by_name:
                    raise InvalidTree(f"{node.name}: unknown parent {node.parent!r}")
                children[node.parent].append(node.name)
        reachable = _descendants(roots[0], children)
        if unreached := sorted(set(by_name) - reachable):
            raise InvalidTree(f"{unreached[0]}: part of a cycle, not reachable from the root")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_children", {k: tuple(sorted(v)) for k, v in children.items()})

    @property
    def root(self) -> str:
        return next(n.name for n in self.nodes if not n.parent)

    def node(self, name: str) -> BudgetNode | None:
        return self._by_name.get(name)

    def children(self, name: str) -> tuple[str, ...]:
        return self._children.get(name, ())

    def weight(self, name: str) -> float:
        return self._by_name[name].weight

    def leaves(self) -> list[str]:
        return sorted(name for name, kids in self._children.items() if not kids)

    def allocations_of(self, user: str) -> list[str]:
        """Leaves the user may submit to."""
        return [leaf for leaf in self.leaves() if user in self._by_name[leaf].members]

    def can_manage(self, user: str, name: str) -> bool:
        """Managers of a node manage its whole subtree."""
        current = self._by_name.get(name)
        while current is not None:
            if user in current.managers:
                return True
            current = self._by_name.get(current.parent)
        return False

    def sees_all(self, user: str) -> bool:
        """The root's managers see every job (its command and environment included),
        unallocated ones too; anyone else, their own and those of ``visible_to``."""
        return user in self._by_name[self.root].managers

    def visible_to(self, user: str) -> frozenset[str]:
        """The allocations whose jobs ``user`` sees: those they belong to or manage."""
        return frozenset(
            leaf
            for leaf in self.leaves()
            if user in self._by_name[leaf].members or self.can_manage(user, leaf)
        )

    def entitlements(self) -> dict[str, float]:
        """Each leaf's share of the whole cluster."""
        shares: dict[str, float] = {}
        stack = [(self.root, 1.0)]
        while stack:
            name, share = stack.pop()
            kids = self._children[name]
            if not kids:
                shares[name] = share
                continue
            total = sum(self._by_name[k].weight for k in kids)
            stack.extend((k, share * self._by_name[k].weight / total) for k in kids)
        return dict(sorted(shares.items()))

    def with_node(self, node: BudgetNode) -> BudgetTree:
        """A new tree with ``node`` added or replaced (validated like any tree)."""
        kept = [n for n in self.nodes if n.name != node.name]
        return BudgetTree((*kept, node))


def _check(node: BudgetNode) -> None:
    if not node.name:
        raise InvalidTree("a node has no name")
    if len(node.name) > L.MAX_TEXT_CHARS:
        raise InvalidTree(f"{node.name[:20]}…: a name has at most {L.MAX_TEXT_CHARS} characters")
    # Written to fail for NaN too: an entitlement of nan would rank nobody.
    if not 0 < node.weight <= L.MAX_BUDGET_WEIGHT:
        raise InvalidTree(
            f"{node.name}: weight must be > 0 and at most {L.MAX_BUDGET_WEIGHT:,.0f}, "
            f"got {node.weight}"
        )
    for role in ("members", "managers"):
        users = getattr(node, role)
        if len(users) > L.MAX_BUDGET_USERS:
            raise InvalidTree(f"{node.name}: at most {L.MAX_BUDGET_USERS} {role}")
        if any(not 0 < len(user) <= L.MAX_TEXT_CHARS for user in users):
            raise InvalidTree(f"{node.name}: {role} are 1 to {L.MAX_TEXT_CHARS} characters each")


def _descendants(root: str, children: Mapping[str, Iterable[str]]) -> set[str]:
    seen, stack = {root}, [root]
    while stack:
        for kid in children[stack.pop()]:
            if kid not in seen:
                seen.add(kid)
                stack.append(kid)
    return seen
