"""Task ids: built in one place and read back there (libs/core/ids.py)."""

from hypothesis import given
from hypothesis import strategies as st

from libs.core.ids import (
    array_element_id,
    array_of,
    attempt_of,
    batch_task_id,
    in_job,
    is_array_id,
    workflow_task_id,
)

job_ids = st.text(min_size=1, max_size=20)


@given(job_ids, st.integers(min_value=0, max_value=10**6), st.none() | st.integers(0, 4096))
def test_a_batch_task_id_gives_back_its_attempt(
    job_id: str, attempt: int, rank: int | None
) -> None:
    assert attempt_of(batch_task_id(job_id, attempt, rank)) == attempt


def test_ids_have_the_logged_shape() -> None:
    assert batch_task_id("j-1", 2) == "j-1/2"
    assert batch_task_id("j-1", 2, 0) == "j-1/2.0"
    assert workflow_task_id("j-1", "encode") == "j-1/encode"


def test_an_id_without_an_attempt_reads_as_zero() -> None:
    ids = ("j/0", "j/12", "j/2.1", "a/b/3", "j", "j/x", "j/²", "j/.1", "")
    assert [attempt_of(t) for t in ids] == [0, 12, 2, 3, 0, 0, 0, 0, 0]


def test_a_task_is_in_its_job_only() -> None:
    assert in_job("j-1", batch_task_id("j-1", 2, 0))
    assert in_job("j-1", workflow_task_id("j-1", "encode"))
    assert not any(in_job("j-1", t) for t in ("j-10/0", "j-1", "j/1", "x/j-1/0", ""))


@given(st.text("0123456789abcdef", min_size=1, max_size=16), st.integers(0, 999_999))
def test_an_element_id_gives_back_its_array(hex_part: str, index: int) -> None:
    array_id = f"a-{hex_part}"
    assert is_array_id(array_id)
    element = array_element_id(array_id, index)
    assert array_of(element) == array_id and not is_array_id(element)


def test_only_an_array_names_an_array() -> None:
    assert [is_array_id(t) for t in ("a-1f", "j-1f", "a-", "a-1f_2", "a-XY", "")] == [
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    assert [array_of(t) for t in ("a-1f_2", "j-1f_2", "a-1f", "a-1f_", "a-1f_x")] == [
        "a-1f",
        None,
        None,
        None,
        None,
    ]
