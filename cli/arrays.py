"""The indexes of a job array (``qm submit --array``), as Slurm writes them: ``0-9``,
``1,3,5``, ``0-15:4`` (every fourth), or a mix.

An array is one id (``a-…``) with an element per index (``a-…_3``), each an ordinary
job that is told its index (``QM_ARRAY_INDEX``); admission names the elements.
"""

from __future__ import annotations

import re

from libs.core.limits import MAX_ARRAY_ELEMENTS, MAX_ARRAY_INDEX

_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def array_indexes(text: str) -> tuple[int, ...]:
    """The indexes ``text`` names, sorted, each once; an error naming the bad part."""
    indexes: set[int] = set()
    for part in text.split(","):
        match = _PART.match(part.strip())
        if not match:
            raise ValueError(
                f"{part.strip()!r} is not N, N-M or N-M:STEP (e.g. 0-9, 1,3,5, 0-15:4)"
            )
        first, last, step = match.groups()
        low, high, every = int(first), int(last or first), int(step or 1)
        if high < low or every < 1:
            raise ValueError(f"{part.strip()!r}: the range must go up, by a step of at least 1")
        if high > MAX_ARRAY_INDEX:
            raise ValueError(f"{part.strip()!r}: an index is at most {MAX_ARRAY_INDEX}")
        if (high - low) // every + 1 + len(indexes) > MAX_ARRAY_ELEMENTS:
            raise ValueError(f"an array holds at most {MAX_ARRAY_ELEMENTS} jobs")
        indexes.update(range(low, high + 1, every))
    return tuple(sorted(indexes))
