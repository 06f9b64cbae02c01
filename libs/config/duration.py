"""Durations as people write them: ``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``, ``1.5h``,
``10ms`` or plain seconds (``90``, ``2.5``). The one parser of durations, for flags and files;
and moments, written as a duration ago or as a timestamp."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}  # largest first: the order they are written in
PARTS = {**UNITS, "ms": 0.001}  # what may be written (durations are written in UNITS)
_NUMBER = r"\d+(?:\.\d+)?"
_PLAIN = re.compile(_NUMBER)
# Each unit at most once, largest first: 1d2h3m4s, 1h30m, 45s, 1s500ms.
_PARTS = re.compile("".join(f"(?:(?P<{unit}>{_NUMBER}){unit})?" for unit in PARTS))
EXAMPLES = "90s, 15m, 2h, 1d, 1h30m, 10ms or plain seconds"


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ValueError (saying what is expected) if it is no duration."""
    written = text.strip().lower()
    match = _PARTS.fullmatch(written)
    if _PLAIN.fullmatch(written):
        seconds = float(written)
    elif written and match is not None:
        seconds = sum(float(match[unit] or 0) * size for unit, size in PARTS.items())
    else:
        raise ValueError(f"{text!r} is not a duration like {EXAMPLES}")
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def format_duration(seconds: int) -> str:
    """Whole seconds as ``parse_duration`` reads them, largest units first: ``1h30m``."""
    if seconds < 0:
        raise ValueError(f"a duration is not negative, got {seconds}")
    parts = []
    for unit, size in UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def parse_moment(text: str, now: float) -> float:
    """Epoch seconds of ``text``: a duration before ``now`` (``2h``: two hours ago) or an
    ISO 8601 timestamp (``2026-12-04T06:00:00Z``; UTC when it names no zone)."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration ago ({EXAMPLES}) "
            "nor a timestamp like 2026-12-04T06:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
