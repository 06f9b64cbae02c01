from __future__ import annotations

import pytest

from libs.core import Limits, validate_job
from tests.builders import job

LEAVES = ["team-a", "team-b"]


def test_a_valid_job_has_no_violations() -> None:
    assert validate_job(job(2, min_runtime_s=3600), Limits(), LEAVES) == []


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [
        (job(0), "gpus", "must be between 1 and 64, got 0"),
        (job(65), "gpus", "must be between 1 and 64, got 65"),
        (job(1, allocation=""), "allocation", "is required"),
        (
            job(1, allocation="nope"),
            "allocation",
            "unknown allocation 'nope'; known: team-a, team-b",
        ),
        (job(1, user=""), "user", "is required"),
        (
            job(1, min_runtime_s=8 * 3600 + 1),
            "min_runtime_s",
            "must be between 0 and 28800 s (8 h), got 28801",
        ),
        (job(1, command=()), "command", "is required (the program and its arguments)"),
        (job(1, simulated_duration_s=-1.0), "simulated_duration_s", "must be >= 0"),
    ],
)
def test_each_rule_names_its_field(spec: object, field: str, rule: str) -> None:
    [violation] = validate_job(spec, Limits(), LEAVES)  # type: ignore[arg-type]
    assert (violation.field, violation.rule) == (field, rule)


def test_unknown_gpu_types_are_refused_when_types_are_configured() -> None:
    limits = Limits(gpu_types=frozenset({"H100", "A100"}))
    [violation] = validate_job(job(1, gpu_type="V100"), limits, LEAVES)
    assert str(violation) == "gpu_type: unknown type 'V100'; known: A100, H100"
