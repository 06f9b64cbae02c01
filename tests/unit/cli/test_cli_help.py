"""Every command's ``--help`` shows its text whole: brackets in it (a JSON shape such as
``{"jobs": [qm.v1.Job, ...]}``, a default in ``[default: ...]``) are text, not markup."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cli.app import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path below ``group`` (typer's own click), groups too."""
    found = []
    for name, command in sorted(group.commands.items()):
        found.append((*path, name))
        if hasattr(command, "commands"):
            found += _commands(command, (*path, name))
    return found


def _flat(text: str) -> str:
    """The text without whitespace: help is wrapped to the terminal, at hyphens too."""
    return "".join(text.split())


COMMANDS = _commands(typer.main.get_command(app))


def test_every_command_is_checked() -> None:
    assert {("status",), ("budget", "usage"), ("sim", "run"), ("audit", "verify")} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_shows_every_word_of_the_command_and_its_options(path: tuple[str, ...]) -> None:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    texts = [inspect.cleandoc(command.help or "").partition("\f")[0]]
    texts += [p.help for p in command.params if getattr(p, "help", None)]
    for expected in texts:
        for paragraph in expected.split("\n\n"):
            assert _flat(paragraph) in shown, f"qm {' '.join(path)} --help lost: {paragraph}"
