import pytest
from qm.v1 import events_pb2, types_pb2

from libs.events import DecodeError, decode, encode, event_type, new_envelope


def test_an_envelope_round_trips() -> None:
    env = new_envelope(events_pb2.ClockTick(), producer="ticker", cluster="c1")
    back = decode(encode(env))
    assert back == env and event_type(back) == "clock_tick" and back.cluster == "c1"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty record value"),
        (b"\xff\xff\xff", "not a qm.v1.Envelope"),
        (events_pb2.Envelope(event_id="x").SerializeToString(), "no payload"),
        (events_pb2.Envelope(clock_tick=events_pb2.ClockTick()).SerializeToString(), "no event_id"),
    ],
)
def test_garbage_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(data)


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(253_402_300_800, 0), (-62_135_596_801, 0), (2**40, 0), (0, -1), (0, 1_000_000_000)],
)
def test_a_time_no_reader_can_convert_is_refused(seconds: int, nanos: int) -> None:
    # Placement stamps its decisions with the input's time: accepted, such a record
    # would raise on every attempt and stop its partition.
    env = new_envelope(events_pb2.ClockTick(), producer="ticker")
    env.occurred_at.seconds, env.occurred_at.nanos = seconds, nanos
    with pytest.raises(DecodeError, match="occurred_at"):
        decode(encode(env))


def test_the_ends_of_the_time_range_are_accepted() -> None:
    for seconds, nanos in ((253_402_300_799, 999_999_999), (-62_135_596_800, 0)):
        env = new_envelope(events_pb2.ClockTick(), producer="ticker")
        env.occurred_at.seconds, env.occurred_at.nanos = seconds, nanos
        assert decode(encode(env)).occurred_at == env.occurred_at


def test_a_non_payload_message_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="not an envelope payload"):
        new_envelope(types_pb2.Gpu(), producer="x")
