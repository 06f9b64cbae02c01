"""Command-line options declared once, on the dataclass field they fill.

A benchmark's or a chaos run's parameters are a frozen dataclass; a field made with
``option`` is also a flag, with the field's default, type and help. ``add_options``
adds a class's flags to a parser and ``from_options`` builds the class back from the
parsed arguments, so neither repeats the list of fields.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import Field, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def option(
    default: T,
    help: str | None = None,
    *,
    flag: str = "",
    metavar: str = "",
    choices: tuple[str, ...] = (),
) -> T:
    """A field that is also a flag: ``flag``, or ``--`` and the field's name with dashes.

    A tuple or frozenset is given as a comma-separated list.
    """
    metadata = {"flag": flag, "help": help, "metavar": metavar, "choices": choices}
    return field(default=default, metadata=metadata)


def add_options(parser: argparse._ActionsContainer, cls: type[DataclassInstance]) -> None:
    for f in _options(cls):
        parser.add_argument(
            _flag(f),
            type=_parser(f.default),
            default=f.default,
            help=f.metadata["help"],
            metavar=f.metadata["metavar"] or None,
            choices=f.metadata["choices"] or None,
        )


def from_options(cls: type[D], args: argparse.Namespace, **given: Any) -> D:
    """``cls`` of the flags ``add_options`` added; ``given``: fields set otherwise."""
    values = {f.name: getattr(args, _dest(f)) for f in _options(cls) if f.name not in given}
    return cls(**values, **given)


def _options(cls: type[DataclassInstance]) -> Iterator[Field[Any]]:
    return (f for f in fields(cls) if "flag" in f.metadata)


def _flag(f: Field[Any]) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _dest(f: Field[Any]) -> str:
    return _flag(f).removeprefix("--").replace("-", "_")


def _parser(default: object) -> Callable[[str], object]:
    if isinstance(default, tuple | frozenset):
        collection = type(default)
        return lambda text: collection(n.strip() for n in text.split(",") if n.strip())
    return type(default)
