"""Admission rules for a job spec. Each violation names the field and the rule."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from libs.core.model import JobSpec

HOUR = 3600


@dataclass(frozen=True)
class Limits:
    max_gpus: int = 64
    max_min_runtime_s: int = 8 * HOUR
    gpu_types: frozenset[str] = frozenset()  # empty: any type is accepted


@dataclass(frozen=True)
class Violation:
    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


def validate_job(spec: JobSpec, limits: Limits, allocations: Collection[str]) -> list[Violation]:
    """All the ways ``spec`` breaks the rules; empty when it is valid.

    ``allocations`` are the leaves of the budget tree; membership is a
    permission question, checked by the caller.
    """
    found: list[Violation] = []
    if not spec.allocation:
        found.append(Violation("allocation", "is required"))
    elif spec.allocation not in allocations:
        known = ", ".join(sorted(allocations)) or "none"
        found.append(
            Violation("allocation", f"unknown allocation {spec.allocation!r}; known: {known}")
        )
    if not spec.user:
        found.append(Violation("user", "is required"))
    if not 1 <= spec.gpus <= limits.max_gpus:
        found.append(Violation("gpus", f"must be between 1 and {limits.max_gpus}, got {spec.gpus}"))
    if spec.gpu_type and limits.gpu_types and spec.gpu_type not in limits.gpu_types:
        types = ", ".join(sorted(limits.gpu_types))
        found.append(Violation("gpu_type", f"unknown type {spec.gpu_type!r}; known: {types}"))
    if not 0 <= spec.min_runtime_s <= limits.max_min_runtime_s:
        found.append(
            Violation(
                "min_runtime_s",
                f"must be between 0 and {limits.max_min_runtime_s} s "
                f"({limits.max_min_runtime_s / HOUR:g} h), got {spec.min_runtime_s}",
            )
        )
    if not spec.command or not spec.command[0]:
        found.append(Violation("command", "is required (the program and its arguments)"))
    if spec.simulated_duration_s < 0:
        found.append(Violation("simulated_duration_s", "must be >= 0"))
    if not 0.0 <= spec.simulated_utilization <= 1.0:
        found.append(Violation("simulated_utilization", "must be between 0 and 1"))
    if spec.min_gpu_memory_gib < 0:
        found.append(Violation("min_gpu_memory_gib", "must be >= 0"))
    return found
