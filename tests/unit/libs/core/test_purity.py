"""The core stays pure: no module in libs/core (the baselines the simulator compares with
included) imports I/O, clocks or randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import libs.core

FORBIDDEN = {
    "asyncio",
    "socket",
    "os",
    "time",
    "random",
    "datetime",
    "subprocess",
    "threading",
    "aiokafka",
    "grpc",
    "faust",
    "urllib",
    "http",
    "pathlib",
    "uuid",
    "qm",
}


def test_core_imports_nothing_impure() -> None:
    offenders = []
    for path in Path(libs.core.__file__).parent.rglob("*.py"):
        for statement in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom) and statement.module:
                names = [statement.module]
            offenders += [
                f"{path.name}: {name}" for name in names if name.split(".")[0] in FORBIDDEN
            ]
    assert offenders == []
