"""Job array indexes, written as Slurm users write them; qm submit --array."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.app import app
from cli.arrays import MAX_JOBS, array_indexes, element_request_id
from tests.unit.cli.conftest import Admission


@pytest.mark.parametrize(
    ("text", "indexes"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("1,3,5", (1, 3, 5)),
        ("0-15:4", (0, 4, 8, 12)),
        ("7", (7,)),
        ("5-6, 1, 5", (1, 5, 6)),
    ],
)
def test_indexes_as_slurm_writes_them(text: str, indexes: tuple[int, ...]) -> None:
    assert array_indexes(text) == indexes


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a-b", "is not N, N-M or N-M:STEP"),
        ("3-1", "must go up"),
        ("0-9:0", "step of at least 1"),
        ("-1", "is not N"),
        ("", "is not N"),
        (f"0-{MAX_JOBS}", f"at most {MAX_JOBS} jobs"),
    ],
)
def test_a_bad_array_is_refused_with_its_part_named(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        array_indexes(text)


@given(st.sets(st.integers(0, 10_000), min_size=1, max_size=50))
def test_any_list_of_indexes_reads_back(chosen: set[int]) -> None:
    assert array_indexes(",".join(map(str, chosen))) == tuple(sorted(chosen))


def test_each_element_has_a_request_id_of_its_own_that_a_retry_repeats() -> None:
    ids = {element_request_id("r", i) for i in range(3)}
    assert len(ids) == 3 and element_request_id("r", 1) == element_request_id("r", 1)


def test_an_array_says_once_what_will_protect_its_jobs(admission: Admission) -> None:
    args = ["submit", "--array", "0-2", "--allocation", "nlp", "--min-runtime", "10m", "--", "x"]
    result = CliRunner().invoke(app, args, env=admission.env)
    assert result.exit_code == 0, result.output
    submitted, told = result.stdout.splitlines()
    assert submitted == "submitted 3 jobs: j-1 j-1 j-1"  # the fake names every job j-1
    assert told.startswith("charged: protected for 10m from its start if placed within nlp's")
