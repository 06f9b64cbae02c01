"""Look-ahead eviction: which resident models make room for a new one.

First models no queued task needs, then those needed furthest ahead; never
the model the running task uses. Pure: the caller says what is resident and
when each model is next needed.
"""

from __future__ import annotations

from collections.abc import Mapping


def evict_for(
    need_mb: float,
    capacity_mb: float,
    resident: Mapping[str, float],
    next_use_ms: Mapping[str, float],
    pinned: frozenset[str] = frozenset(),
    *,
    oldest_first: bool = False,
) -> tuple[str, ...] | None:
    """Models to evict so that ``need_mb`` fits, or None when it cannot.

    ``resident`` maps model to size; ``next_use_ms`` holds the models some
    queued task needs, with when; ``pinned`` models (in use) are never evicted.
    Models with the same next use (in particular those no task needs) go by
    name, or with ``oldest_first`` in ``resident``'s order: a caller that keeps
    it least recently used first gets LRU among them.
    """
    free = capacity_mb - sum(resident.values())
    if free >= need_mb:
        return ()
    never = float("inf")
    position = {m: i for i, m in enumerate(resident)}
    candidates = sorted(
        (m for m in resident if m not in pinned),
        # Unneeded first (their next use is "never"), then the furthest next use.
        key=lambda m: (-next_use_ms.get(m, never), position[m] if oldest_first else 0, m),
    )
    chosen: list[str] = []
    for model in candidates:
        if free >= need_mb:
            break
        chosen.append(model)
        free += resident[model]
    return tuple(chosen) if free >= need_mb else None
