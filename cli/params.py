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
from libs.core.decisions import WARNING_SIGNALS
from libs.events.wire_time import duration as wire_duration

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


# How a job waited for (``--after JOB[:ok|:any]``) must end: ok, exit code 0; any, however.
CONDITIONS = {"ok": types_pb2.DEPENDENCY_CONDITION_OK, "any": types_pb2.DEPENDENCY_CONDITION_ANY}


def dependency(text: str) -> types_pb2.Dependency:
    """A ``JOB[:ok|:any]`` flag; ``:ok`` when it names no condition."""
    job_id, colon, condition = text.partition(":")
    condition = condition.lower() if colon else "ok"
    if not job_id or condition not in CONDITIONS:
        raise _error(f"{text!r} is not JOB[:ok|:any]")
    return types_pb2.Dependency(job_id=job_id, condition=CONDITIONS[condition])


def stop_warning(text: str) -> types_pb2.StopWarning:
    """A ``SIG@DURATION`` flag (``USR1@20s``, ``SIGUSR1@2m``): that signal that long
    before SIGTERM, whole seconds rounded up."""
    name, at, when = text.partition("@")
    name = name.upper().removeprefix("SIG")
    if not at or name not in WARNING_SIGNALS:
        signals = ", ".join(sorted(WARNING_SIGNALS))
        raise _error(f"{text!r} is not SIG@DURATION with SIG one of {signals} (e.g. USR1@20s)")
    seconds = Duration(positive=True)(when)
    return types_pb2.StopWarning(signal=name, before=wire_duration(math.ceil(seconds)))


def mount(text: str) -> types_pb2.Mount:
    """A ``NAME:/path`` flag: a volume the cluster declares, where the job sees it."""
    volume, colon, path = text.partition(":")
    if not colon or not volume or not path.startswith("/"):
        raise _error(f"{text!r} is not NAME:/path (a declared volume, an absolute path)")
    return types_pb2.Mount(volume=volume, path=path)


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


def duration(shown: str, help: str, *names: str, positive: bool = False) -> Any:
    """A duration flag; ``shown`` is its default as people write it; ``names``, its own
    (default: the parameter's)."""
    return typer.Option(
        *names, parser=Duration(positive), show_default=shown, metavar="DURATION", help=help
    )
