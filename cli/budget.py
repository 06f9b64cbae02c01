"""``qm budget set``: a change to one node of the budget tree, as a person means it.

Only what the command names changes: a weight, a parent, members or managers (whole
lists with ``--member``/``--manager``, one at a time with ``--add-…``/``--remove-…``);
the rest of the node stays as it is. The service replaces a node whole, so the node is
read first and sent back with the tree's version, which the service checks. What the
service made of it is said field by field (``changes``); a node sent back as it was
changes nothing, and the tree keeps its version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.internal.containers import RepeatedScalarFieldContainer
from qm.v1 import types_pb2


@dataclass(frozen=True)
class NodeEdit:
    """What ``qm budget set`` was told; None (or empty) leaves a field as it is."""

    parent: str | None = None
    weight: float | None = None
    members: Sequence[str] | None = None
    managers: Sequence[str] | None = None
    add_members: Sequence[str] = ()
    remove_members: Sequence[str] = ()
    add_managers: Sequence[str] = ()
    remove_managers: Sequence[str] = ()


def edited_node(
    current: types_pb2.BudgetNode | None, name: str, edit: NodeEdit
) -> types_pb2.BudgetNode:
    """A copy of ``current``, the node ``name`` as read, with ``edit`` applied; a new node
    (weight 1 unless given) when there is none (None)."""
    node = types_pb2.BudgetNode(name=name, weight=1.0)
    if current is not None:
        node.CopyFrom(current)
    if edit.parent is not None:
        node.parent = edit.parent
    if edit.weight is not None:
        node.weight = edit.weight
    _edit_list(node.members, edit.members, edit.add_members, edit.remove_members)
    _edit_list(node.managers, edit.managers, edit.add_managers, edit.remove_managers)
    return node


def _edit_list(
    names: RepeatedScalarFieldContainer[str],
    replace: Sequence[str] | None,
    add: Sequence[str],
    remove: Sequence[str],
) -> None:
    kept = list(replace) if replace is not None else list(names)
    kept += [n for n in add if n not in kept]
    gone = set(remove)
    names[:] = [n for n in kept if n not in gone]


def changes(before: types_pb2.BudgetNode | None, after: types_pb2.BudgetNode) -> list[str]:
    """What differs from ``before`` (None: a new node) to ``after``, a line per field:
    ``weight: 1 -> 2``, ``members: +bob, -carol``; nothing when they are the same."""
    lines = []
    if before is None or before.parent != after.parent:
        was = "" if before is None else f"{before.parent or '(root)'} -> "
        lines.append(f"parent: {was}{after.parent or '(root)'}")
    if before is None or before.weight != after.weight:
        was = "" if before is None else f"{before.weight:g} -> "
        lines.append(f"weight: {was}{after.weight:g}")
    for field in ("members", "managers"):
        old = [] if before is None else list(getattr(before, field))
        new = list(getattr(after, field))
        moved = [f"+{n}" for n in new if n not in old] + [f"-{n}" for n in old if n not in new]
        if moved:
            lines.append(f"{field}: {', '.join(moved)}")
    return lines
