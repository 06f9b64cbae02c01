"""Job array indexes, written as Slurm users write them; qm submit --array."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli.app import app
from cli.arrays import array_indexes
from libs.core.limits import MAX_ARRAY_ELEMENTS, MAX_ARRAY_INDEX
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
        (f"0-{MAX_ARRAY_ELEMENTS}", f"at most {MAX_ARRAY_ELEMENTS} jobs"),
        (f"{MAX_ARRAY_INDEX + 1}", f"an index is at most {MAX_ARRAY_INDEX}"),
    ],
)
def test_a_bad_array_is_refused_with_its_part_named(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        array_indexes(text)


@given(st.sets(st.integers(0, 10_000), min_size=1, max_size=50))
def test_any_list_of_indexes_reads_back(chosen: set[int]) -> None:
    assert array_indexes(",".join(map(str, chosen))) == tuple(sorted(chosen))


def test_an_array_is_one_id_its_elements_named_by_one_request_id(admission: Admission) -> None:
    args = ["submit", "--array", "0-2", "--allocation", "nlp", "--min-runtime", "10m", "--", "x"]
    result = CliRunner().invoke(app, args, env=admission.env)
    assert result.exit_code == 0, result.output
    submitted, told, follow = result.stdout.splitlines()
    assert submitted == "submitted array a-1: 3 jobs, a-1_0 … a-1_2"
    assert told.startswith("charged: protected for 10m from its start if placed within nlp's")
    assert follow.startswith("follow it with: qm status a-1;")
    specs = [request.spec for request in admission.jobs.requests]
    assert [(s.array.index, s.array.count) for s in specs] == [(0, 3), (1, 3), (2, 3)]
    # One request id names the array: a retry of the whole makes the same elements.
    assert len({s.client_request_id for s in specs}) == 1 and specs[0].client_request_id


def test_a_quiet_array_prints_its_own_id_alone(admission: Admission) -> None:
    result = CliRunner().invoke(
        app, ["submit", "-q", "--array", "4,6", "--", "x"], env=admission.env
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "a-1\n"


def _element(index: int, state: types_pb2.JobState.ValueType) -> types_pb2.Job:
    spec = types_pb2.JobSpec(array=types_pb2.ArrayElement(index=index, count=4))
    return types_pb2.Job(job_id=f"a-1_{index}", state=state, spec=spec)


def test_status_of_an_array_lists_every_element_by_index_and_counts_their_states(
    admission: Admission,
) -> None:
    S = types_pb2
    admission.jobs.listed = [
        _element(2, S.JOB_STATE_RUNNING),
        _element(0, S.JOB_STATE_FINISHED),
        _element(1, S.JOB_STATE_FINISHED),
    ]  # newest first, as admission lists them; one element never got submitted
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["status", "a-1"], env=admission.env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "array a-1: 3 of 4 elements: 2 FINISHED, 1 RUNNING"
    assert re.findall(r"a-1_\d", result.stdout) == ["a-1_0", "a-1_1", "a-1_2"]
    [asked] = admission.jobs.lists
    assert (asked.array_id, asked.limit) == ("a-1", MAX_ARRAY_ELEMENTS)
    filtered = ["status", "a-1", "--state", "FINISHED"]
    assert "array a-1: 3 elements:" in CliRunner().invoke(app, filtered, env=admission.env).stdout


def test_status_of_an_array_nobody_submitted_says_so(admission: Admission) -> None:
    result = CliRunner().invoke(app, ["status", "a-2"], env=admission.env)
    assert result.exit_code == 1
    assert "no job array 'a-2'" in result.stderr
