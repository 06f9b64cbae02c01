"""The run's verdict: one row per check, printed as a table and written as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.perf.stats import console, table

EVIDENCE_LINES = 5


@dataclass
class Row:
    name: str
    value: str
    expected: str
    ok: bool | None  # None: reported, not judged
    evidence: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "info" if self.ok is None else "PASS" if self.ok else "FAIL"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)  # counts for the JSON, not judged

    def add(
        self,
        name: str,
        value: object,
        expected: str,
        ok: bool | None,
        evidence: Sequence[object] = (),
    ) -> Row:
        row = Row(name, str(value), expected, ok, [str(e) for e in evidence])
        self.rows.append(row)
        return row

    def count(self, name: str, found: Sequence[object], *, expected: int = 0) -> Row:
        """A row for a list of violations: its length against ``expected``, examples as evidence."""
        return self.add(name, len(found), str(expected), len(found) == expected, found)

    @property
    def failed(self) -> list[Row]:
        return [row for row in self.rows if row.ok is False]

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "passed": not self.failed,
            "rows": [{**asdict(row), "verdict": row.verdict} for row in self.rows],
            "facts": self.facts,
        }
        path.write_text(json.dumps(body, indent=2, default=str) + "\n")

    def print(self) -> None:
        table(
            "chaos: invariants, recovery and fuzzing",
            ["check", "value", "expected", "verdict"],
            [[row.name, row.value, row.expected, row.verdict] for row in self.rows],
        )
        for row in self.failed:
            console.print(f"[bold red]FAIL[/] {row.name}: {row.value} (expected {row.expected})")
            for line in row.evidence[:EVIDENCE_LINES]:
                console.print(f"    {line}", markup=False)
            if len(row.evidence) > EVIDENCE_LINES:
                console.print(f"    ... {len(row.evidence) - EVIDENCE_LINES} more in the JSON")
