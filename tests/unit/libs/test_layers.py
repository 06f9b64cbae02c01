"""The arrows of the house point down: a package of libs/ imports only the packages
below it. The core is at the bottom (its purity: ``core/test_purity.py``); the drivers
of the core (the simulator, the audit) are at the top, and nothing below imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import libs

# Each package and the libs packages it may import (its own modules aside).
MAY_IMPORT = {
    "core": set(),
    "events": {"core"},
    "config": {"core", "events"},
    "auth": {"core", "events", "config"},
    "telemetry": {"core", "events", "config"},
    "readmodels": {"core", "events", "config"},
    "bus": {"core", "events", "config", "auth", "telemetry"},
    "trust": {"core", "events", "config", "auth", "bus"},
    "audit": {"core", "events", "config", "auth", "telemetry", "bus", "trust"},
    "sim": {"core", "events", "config", "readmodels"},
}


def _imported(path: Path) -> set[str]:
    found = set()
    for statement in ast.walk(ast.parse(path.read_text())):
        if isinstance(statement, ast.Import):
            found |= {alias.name for alias in statement.names}
        elif isinstance(statement, ast.ImportFrom) and statement.module:
            found.add(statement.module)
    return {name.split(".")[1] for name in found if name.startswith("libs.")}


def test_no_package_of_libs_imports_one_above_it() -> None:
    root = Path(libs.__file__).parent
    assert {p.name for p in root.iterdir() if (p / "__init__.py").exists()} == set(MAY_IMPORT)
    offenders = [
        f"{path.relative_to(root)} imports libs.{name}"
        for package, allowed in MAY_IMPORT.items()
        for path in sorted((root / package).rglob("*.py"))
        for name in sorted(_imported(path) - allowed - {package})
    ]
    assert offenders == []
