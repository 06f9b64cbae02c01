"""Flag types of ``qm`` that typer has no words for, and the bounds every number flag declares.

A number flag declares ``min`` and ``max`` (typer checks both, which also refuses NaN
and infinities); these are the limits of what a request can carry, the service judges
the rest. A parser raises ``PydanticCustomError`` so that typer shows its message as
written, after the flag's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import typer
from pydantic_core import PydanticCustomError

DAY_S = 86_400.0
INT32 = (-(2**31), 2**31 - 1)
UINT32_MAX = 2**32 - 1
SEED_MAX = 2**63 - 1

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S}


@dataclass(frozen=True)
class Duration:
    """A duration flag: ``90``, ``90s``, ``30m``, ``8h`` or ``7d``; seconds, as a float."""

    positive: bool = False  # refuse 0
    most_s: float = 3650 * DAY_S

    def __call__(self, value: str | float) -> float:
        if isinstance(value, str):
            match = _DURATION.match(value.strip())
            if not match:
                raise _error(f"{value!r} is not a duration like 90s, 30m, 8h or 7d")
            value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
        if not (value > 0 if self.positive else value >= 0) or not value <= self.most_s:
            low = "> 0" if self.positive else ">= 0"
            days = self.most_s / DAY_S
            raise _error(f"the duration must be {low} and at most {days:g} days, got {value:g} s")
        return value


def key_value(text: str) -> str:
    """A ``KEY=VALUE`` flag, kept whole."""
    key, equals, _ = text.partition("=")
    if not equals or not key:
        raise _error(f"{text!r} is not KEY=VALUE")
    return text


def _error(message: str) -> PydanticCustomError:
    # No context: the message is shown as it is, braces and all.
    return PydanticCustomError("qm_flag", message)


def input_file(help: str, **options: Any) -> Any:
    """A flag naming a file to read: typer checks that it exists and is a readable file."""
    return typer.Option(exists=True, dir_okay=False, readable=True, help=help, **options)


def duration(shown: str, help: str, *, positive: bool = False) -> Any:
    """A duration flag; ``shown`` is its default as people write it."""
    return typer.Option(
        parser=Duration(positive), show_default=shown, metavar="DURATION", help=help
    )
