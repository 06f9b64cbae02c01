"""The load rule alone: what counts, how much, and for how long."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from libs.core.compass.load import Load, Work
from libs.core.state import State

SECOND = 1000.0


def load() -> Load:
    return Load(State(), arrival_window_ms=SECOND, admit_window_ms=SECOND)


def test_work_counts_less_with_age_and_not_past_two_windows() -> None:
    # 1,500 ms arrived at 0 counts whole then, half (750) a window on, not two windows on.
    book = load()
    book.arrive("a", Work(0, "", 1500))
    new = Work(0, "", 1500)
    assert book.sheds("b", new, gpus=2.5)  # 1,500 + 1,500 > 2.5 GPUs x 1 s
    assert not book.sheds("b", new._replace(at_ms=SECOND), gpus=2.5)  # 750 + 1,500
    assert not book.sheds("b", new._replace(at_ms=2 * SECOND), gpus=1)  # alone now


def test_only_work_no_larger_arrived_counts_against_a_workflow() -> None:
    book = load()
    book.arrive("big", Work(0, "", 5000))
    book.arrive("small", Work(0, "", 100))
    assert not book.sheds("s", Work(0, "", 100), gpus=1)  # 100 + 100: the big one is behind
    assert book.sheds("m", Work(0, "", 1000), gpus=1)  # 100 + 1,000 > 1,000


def test_a_workflow_too_large_to_fit_alone_waits_only_for_others() -> None:
    book = load()
    book.arrive("huge", Work(0, "", 9000))
    assert not book.sheds("huge", Work(0, "", 9000), gpus=1)
    book.admit("other", Work(0, "", 10))
    assert book.sheds("huge", Work(0, "", 9000), gpus=1)


def test_work_admitted_counts_for_every_workflow_larger_or_not() -> None:
    book = load()
    book.admit("peer/x", Work(0, "", 1900))
    assert book.sheds("tiny", Work(0, "", 200), gpus=2)
    assert not book.sheds("tiny", Work(0, "", 100), gpus=2)


def test_admit_load_narrows_the_arrivals_test_not_the_share_of_admissions() -> None:
    # Arrivals may keep admit_load of the GPUs busy; admissions, all of their time.
    arrivals = load()
    arrivals.arrive("a", Work(0, "", 900))
    assert not arrivals.sheds("b", Work(0, "", 1000), gpus=2, admit_load=1.0)  # 1,900
    assert arrivals.sheds("b", Work(0, "", 1000), gpus=2, admit_load=0.9)  # > 1,800
    admissions = load()
    admissions.admit("a", Work(0, "", 900))
    assert not admissions.sheds("b", Work(0, "", 1000), gpus=2, admit_load=0.9)
    assert admissions.sheds("b", Work(0, "", 1200), gpus=2, admit_load=0.9)  # 2,100 > 2,000


def test_only_the_workflows_gpu_type_counts_and_any_type_counts_all() -> None:
    book = load()
    book.arrive("h", Work(0, "H100", 900))
    assert not book.sheds("a", Work(0, "A100", 1000), gpus=1)
    assert book.sheds("b", Work(0, "H100", 1000), gpus=1)
    assert book.sheds("c", Work(0, "", 1000), gpus=1)


def test_a_write_drops_the_entries_past_their_window() -> None:
    # What the state keeps (and its digest covers) stays bounded by the windows.
    book = load()
    book.arrive("old", Work(0, "", 100))
    book.admit("old", Work(0, "", 100))
    book.peer_arrived("theirs", Work(0, "", 100))
    book.arrive("new", Work(2 * SECOND, "", 100))
    book.admit("new", Work(2 * SECOND, "", 100))
    book.peer_arrived("newer", Work(2 * SECOND, "", 100))
    assert list(book._arrived) == list(book._admitted) == ["new"]
    assert list(book._peers) == ["newer"]


def test_a_planner_among_several_admits_its_share_of_the_work_that_arrived() -> None:
    # 1,000 ms arrived here and 3,000 at peers: this planner admits a quarter of the
    # 2,000 ms the GPUs run. 400 admitted: 200 more is past 500, 50 is not.
    book = load()
    book.arrive("mine", Work(0, "", 1000))
    book.peer_arrived("theirs", Work(0, "", 3000))
    book.admit("mine", Work(0, "", 400))
    assert book.sheds("x", Work(0, "", 200), gpus=2)
    assert not book.sheds("y", Work(0, "", 50), gpus=2)
    alone = load()
    alone.arrive("mine", Work(0, "", 1000))
    alone.admit("mine", Work(0, "", 400))
    assert not alone.sheds("x", Work(0, "", 200), gpus=2)


def test_a_peers_word_on_a_job_counts_once_and_yields_to_the_planners_own() -> None:
    book = load()
    book.peer_arrived("p", Work(0, "", 100))
    book.peer_arrived("p", Work(500, "", 900))  # read again: nothing changes
    assert (dict(book._peers), dict(book._arrived)) == ({"p": Work(0, "", 100)}, {})
    book.arrive("p", Work(600, "", 100))  # handed to this planner after all: its own
    assert (dict(book._peers), dict(book._arrived)) == ({}, {"p": Work(600, "", 100)})
    book.peer_arrived("p", Work(700, "", 100))  # late news of the peer's: still its own
    assert (dict(book._peers), dict(book._arrived)) == ({}, {"p": Work(600, "", 100)})


entries = st.lists(
    st.tuples(
        st.sampled_from(["admit", "arrive", "peer"]),
        st.floats(0, 3000),
        st.sampled_from(["", "H100", "A100"]),
        st.floats(0, 5000),
    ),
    max_size=20,
)


@given(entries, st.floats(0, 5000), st.floats(0, 5000), st.sampled_from(["", "H100"]))
def test_a_larger_workflow_waits_whenever_a_smaller_one_does(
    written: list[tuple[str, float, str, float]], small: float, more: float, gpu_type: str
) -> None:
    book = load()
    for i, (how, at, kind, work) in enumerate(sorted(written, key=lambda e: e[1])):
        write = {"admit": book.admit, "arrive": book.arrive, "peer": book.peer_arrived}[how]
        write(f"e{i}", Work(at, kind, work))
    now = 3000.0
    book.arrive("x", Work(now, gpu_type, small))  # as the scheduler does before asking
    if book.sheds("x", Work(now, gpu_type, small), gpus=2):
        assert book.sheds("x", Work(now, gpu_type, small + more), gpus=2)
