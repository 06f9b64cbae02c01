"""``-o table|json|yaml``: how a read command prints what it read.

``table`` (the default) is for a person: rich tables, colours, a terminal's width.
``json`` and ``yaml`` are for scripts: the same data whatever the terminal, on stdout
alone (progress and notes go to stderr). Protobuf messages are written with
``google.protobuf.json_format``, field names as the proto spells them, every field
present (zeros and empty lists too), enums by name (``JOB_STATE_RUNNING``),
timestamps in RFC 3339, 64-bit integers as strings (protobuf's JSON mapping); other
reports are plain objects whose keys the command's ``--help`` names.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console, RenderableType

Document = Mapping[str, Any]


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


OutputFlag = Annotated[
    Format,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table for people; json or yaml for scripts (the shape is in this help)",
    ),
]


def stdout_console() -> Console:
    """Where a command prints for a person: a terminal's width, else (a pipe, a file)
    every line whole, as rich would cut it to 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=1 << 16)


def message(msg: Message) -> dict[str, Any]:
    """A protobuf message as a document, every field present, names as in the proto."""
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def records(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """A printed table's rows as objects keyed by its column names."""
    return [dict(zip(header, row, strict=True)) for row in rows]


def text(fmt: Format, document: Document) -> str:
    """``document`` as JSON or YAML text, ending in a newline."""
    if fmt is Format.JSON:
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if fmt is Format.YAML:
        return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)
    raise ValueError("a table is not text")


def emit(
    console: Console,
    fmt: Format,
    document: Callable[[], Document],
    table: Callable[[], RenderableType],
) -> None:
    """Print the table on ``console``, or the document, as it is, on stdout."""
    if fmt is Format.TABLE:
        console.print(table())
    else:
        write(fmt, document())


def write(fmt: Format, document: Document) -> None:
    """The document, as it is, on stdout: no markup, no wrapping at a terminal's width."""
    sys.stdout.write(text(fmt, document))
    sys.stdout.flush()


def emit_one(
    console: Console,
    fmt: Format,
    document: Callable[[], Document],
    line: Callable[[], RenderableType],
) -> None:
    """One item of a stream, as it comes: a line on ``console``; under json one compact
    document per line (JSON Lines), under yaml one ``---`` document each."""
    if fmt is Format.TABLE:
        console.print(line())
        return
    if fmt is Format.JSON:
        sys.stdout.write(json.dumps(document(), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("---\n" + text(fmt, document()))
    sys.stdout.flush()


def notes(console: Console, errors: Console, fmt: Format) -> Console:
    """Where a command's remarks go: beside its table, or on stderr under json and yaml,
    so that stdout holds the document alone."""
    return console if fmt is Format.TABLE else errors
