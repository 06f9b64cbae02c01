"""The comparison policies are core code: no I/O, clocks or randomness, like the rest."""

from __future__ import annotations

import ast
from pathlib import Path

import libs.core.baselines
from tests.unit.libs.core.test_purity import FORBIDDEN


def test_policies_import_nothing_impure() -> None:
    offenders = []
    for path in sorted(Path(libs.core.baselines.__file__).parent.glob("*.py")):
        for statement in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom) and statement.module:
                names = [statement.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
