"""Flag types of ``qm`` that typer has no words for, and the bounds every number flag declares.

A number flag declares its bounds: the limits of what a request can carry (the service
judges the rest). An integer flag declares typer's ``min`` and ``max``; a real-valued
one is a ``number`` flag, whose parser also says when a value is not finite (typer's
own check would answer ``nan`` with a bound it broke). A parser raises
``PydanticCustomError`` so that typer shows its message as written, after the flag's
name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import typer
from pydantic_core import PydanticCustomError
from qm.v1 import types_pb2

from libs.config.duration import parse_duration

DAY_S = 86_400.0
INT32 = (-(2**31), 2**31 - 1)
UINT32_MAX = 2**32 - 1
SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class Duration:
    """A duration flag (``libs.config.duration``: ``90s``, ``1h30m``, ...); seconds, as a float."""

    positive: bool = False  # refuse 0
    most_s: float = 3650 * DAY_S

    def __call__(self, value: str | float) -> float:
        if isinstance(value, str):
            try:
                value = parse_duration(value)
            except ValueError as exc:
                raise _error(str(exc)) from None
        if not (value > 0 if self.positive else value >= 0) or not value <= self.most_s:
            low = "> 0" if self.positive else ">= 0"
            days = self.most_s / DAY_S
            raise _error(f"the duration must be {low} and at most {days:g} days, got {value:g} s")
        return value


@dataclass(frozen=True)
class Number:
    """A real-valued flag: a finite number from ``least`` to ``most``."""

    least: float
    most: float

    def __call__(self, value: str | float) -> float:
        try:
            number = float(value)
        except ValueError:
            raise _error(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise _error(f"{value!r} is not a finite number")
        if not self.least <= number <= self.most:
            raise _error(f"must be from {self.least:g} to {self.most:g}, got {number:g}")
        return number


def number(help: str, *, least: float, most: float, **options: Any) -> Any:
    """A real-valued flag, finite and from ``least`` to ``most`` (shown as typer shows a
    range)."""
    shown = f"<number> [{least:g}<=x<={most:g}]"
    return typer.Option(parser=Number(least, most), metavar=shown, help=help, **options)


# The states a job can be in, as ``qm status --state`` takes them.
JOB_STATES = tuple(
    types_pb2.JobState.Name(v).removeprefix("JOB_STATE_")
    for v in types_pb2.JobState.values()
    if v != types_pb2.JOB_STATE_UNSPECIFIED
)


def job_states(flags: list[str]) -> list[types_pb2.JobState.ValueType]:
    """``--state`` flags (each may be a comma list; RUNNING, running or JOB_STATE_RUNNING)."""
    states = []
    for word in (w.strip() for flag in flags for w in flag.split(",")):
        name = word.upper().removeprefix("JOB_STATE_")
        if name not in JOB_STATES:
            raise typer.BadParameter(
                f"{word!r} is no job state; use {', '.join(JOB_STATES)}", param_hint="--state"
            )
        states.append(types_pb2.JobState.Value(f"JOB_STATE_{name}"))
    return states


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


def knob(help: str, *, maximum: float = 1e6) -> Any:
    """A flag setting a real-valued policy knob that may be zero, up to ``maximum``."""
    return number(help, least=0, most=maximum)


def duration(shown: str, help: str, *, positive: bool = False) -> Any:
    """A duration flag; ``shown`` is its default as people write it."""
    return typer.Option(
        parser=Duration(positive), show_default=shown, metavar="DURATION", help=help
    )
