"""Tables as the simulators' reports and ``qm sim`` print them: named columns, each
saying how one item's cell reads, and the same table in Markdown."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
Columns = Sequence[tuple[str, Callable[[T], str]]]  # header, and the cell of an item
Table = tuple[list[str], list[list[str]]]  # header, rows


def table(columns: Columns[T], items: Iterable[T]) -> Table:
    return [name for name, _ in columns], [[cell(item) for _, cell in columns] for item in items]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
