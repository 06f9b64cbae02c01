"""Job arrays: one submission, many jobs that differ only in their index (``--array``).

As Slurm writes them: ``0-9``, ``1,3,5``, ``0-15:4`` (every fourth), or a mix. Each job
gets its index as ``QM_ARRAY_INDEX`` and a request id of its own derived from the
array's, so that a retried ``qm submit --array`` makes the same jobs again, not more.
"""

from __future__ import annotations

import re

MAX_JOBS = 1000
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
        if (high - low) // every + 1 + len(indexes) > MAX_JOBS:
            raise ValueError(f"an array holds at most {MAX_JOBS} jobs")
        indexes.update(range(low, high + 1, every))
    return tuple(sorted(indexes))


def element_request_id(array_request_id: str, index: int) -> str:
    return f"{array_request_id}.{index}"
