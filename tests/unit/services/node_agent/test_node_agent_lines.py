"""stdout and stderr merged in whole lines: a line of one never inside a line of the other."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.node_agent.lines import LineJoiner

# Each stream writes its own letter, so the log shows which stream each byte came from.
LETTER = {"stdout": b"o", "stderr": b"e"}
pieces = st.lists(
    st.tuples(
        st.sampled_from(["stdout", "stderr"]),
        st.lists(st.sampled_from(["x", "\n", "\r"]), max_size=12),
        st.booleans(),  # the stream went quiet after this piece: its half line goes
    ),
    max_size=30,
)


def written(joiner: LineJoiner, stream: str, shape: list[str]) -> bytes:
    """Feed ``shape`` with its "x" written as the stream's letter."""
    return joiner.feed(stream, "".join(shape).replace("x", LETTER[stream].decode()).encode())


@given(pieces, st.integers(1, 8))
def test_no_line_mixes_streams_and_nothing_is_lost(
    writes: list[tuple[str, list[str], bool]], bound: int
) -> None:
    joiner = LineJoiner(bound=bound)
    log = b""
    for stream, shape, quiet in writes:
        log += written(joiner, stream, shape)
        if quiet:
            log += joiner.flush(stream)
    log += joiner.flush("stdout") + joiner.flush("stderr")
    for line in log.replace(b"\r", b"\n").split(b"\n"):
        assert not (b"o" in line and b"e" in line), log
    for stream, letter in LETTER.items():
        sent = sum(shape.count("x") for s, shape, _ in writes if s == stream)
        assert log.count(letter) == sent
    ends_sent = sum(shape.count("\n") + shape.count("\r") for _, shape, _ in writes)
    assert log.count(b"\n") + log.count(b"\r") >= ends_sent


def test_a_whole_line_goes_at_once_and_a_half_line_waits_for_its_end() -> None:
    joiner = LineJoiner()
    assert joiner.feed("stdout", b"one\ntw") == b"one\n"
    assert joiner.holds("stdout")
    assert joiner.feed("stderr", b"oops\n") == b"oops\n"
    assert joiner.feed("stdout", b"o\n") == b"two\n"


def test_a_half_line_flushed_is_ended_before_the_other_streams_next_line() -> None:
    joiner = LineJoiner()
    assert joiner.feed("stdout", b"prompt> ") == b""
    assert joiner.flush("stdout") == b"prompt> "  # quiet: it goes as it is
    assert joiner.feed("stdout", b"more") == b""
    assert joiner.flush("stdout") == b"more"  # the same stream goes on on its line
    assert joiner.feed("stderr", b"err\n") == b"\nerr\n"
    assert joiner.feed("stdout", b"x\n") == b"x\n"


def test_a_half_line_past_the_bound_goes_without_waiting() -> None:
    joiner = LineJoiner(bound=4)
    assert joiner.feed("stdout", b"12345") == b"12345"
    assert not joiner.holds("stdout")
    assert joiner.feed("stdout", b"\r50%\r") == b"\r50%\r"  # a progress bar's lines
