"""A GPU's model cache: which resident models make room for a new one, and what
the planner expects a cache to cost.

Two models of the workers' caches (``CacheModel``), the planner's ``Costs`` say which:

- ``lookahead`` (the node agent's): a miss evicts first models no queued task needs,
  then those needed furthest ahead (``evict_for``), never the model the running task
  uses, and evicting is free. The planner's picture of such a cache is least recently
  used first: a model used becomes the most recent (``use``).
- ``fifo-cost`` (the Compass paper's simulator, mNavigator): a miss evicts the models
  loaded first until the new one fits, a hit changes no order, and each eviction takes
  the evicted model's size over the same bandwidth, before the load (``miss_ms``).

Loading a model costs its size over the host-to-GPU bandwidth, and making room
costs reloading what it evicts later (``penalty_ms``). Pure: the caller says what is
resident and when each model is next needed.
"""

from __future__ import annotations

from collections.abc import Mapping

from libs.core.compass.workflow import CacheModel, Costs, Task

__all__ = ["CacheModel", "evict_for", "load_ms", "miss_ms", "penalty_ms", "use"]


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


def use(
    cache: dict[str, float], model: str, size_mb: float, memory_mb: float, fifo: bool = False
) -> None:
    """``model`` runs next with ``cache`` (least recently used first, or with ``fifo``
    first loaded first): it becomes resident and, but with ``fifo``, most recently
    used, evicting the first models in that order to make room."""
    if not model:
        return
    if model in cache:
        if not fifo:
            cache[model] = cache.pop(model)
        return
    victims = evict_for(size_mb, memory_mb, cache, {}, oldest_first=True)
    if victims is None:
        return
    for victim in victims:
        del cache[victim]
    cache[model] = size_mb


def load_ms(costs: Costs, task: Task, cache: Mapping[str, float], memory_mb: float) -> float:
    """What loading the task's model costs with ``cache``: 0 on a hit or without a model
    (``miss_ms`` on a miss)."""
    if not task.model or task.model in cache:
        return 0.0
    return miss_ms(costs, task.model_mb, cache, memory_mb)


def miss_ms(costs: Costs, size_mb: float, cache: Mapping[str, float], memory_mb: float) -> float:
    """What a model of ``size_mb`` that ``cache`` lacks costs before it can run: its load,
    and under ``fifo-cost`` the evictions that make room for it first."""
    load = costs.load_ms(size_mb)
    if costs.cache_model is not CacheModel.FIFO_COST:
        return load
    victims = evict_for(size_mb, memory_mb, cache, {}, oldest_first=True)
    return load + sum(costs.load_ms(cache[m]) for m in (cache if victims is None else victims))


def penalty_ms(costs: Costs, task: Task, cache: Mapping[str, float], memory_mb: float) -> float:
    """What making room for the task's model costs later: reloading the models it
    evicts (inf when it cannot fit)."""
    if not task.model or task.model in cache:
        return 0.0
    victims = evict_for(task.model_mb, memory_mb, cache, {}, oldest_first=True)
    if victims is None:
        return float("inf")
    return sum(costs.load_ms(cache[m]) for m in victims)
