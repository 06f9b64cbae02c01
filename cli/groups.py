"""A group of ``qm`` commands, its help plain text.

Typer reads help as rich markup by default, which drops whatever looks like a tag: the
JSON shapes the read commands document (``{"jobs": [qm.v1.Job, ...]}``) and defaults
written as ``[default: ...]``. qm's help holds no markup, so none is read.
"""

from __future__ import annotations

import typer


def group(help: str) -> typer.Typer:
    """A command group; run without a command, it shows its help."""
    return typer.Typer(no_args_is_help=True, help=help, rich_markup_mode=None)
