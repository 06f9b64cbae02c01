"""Whatever a producer on the bus writes, the core never raises on it.

The bus is a boundary: a buggy or hostile node agent can write any envelope. Those that
decode are turned into inputs (or answered at the edge), and the scheduler must fold each
without raising: ``driver.step`` answers a defect with ``internal error``, but the state
the raise left half-written would stay. Envelopes of every payload type are drawn from
their descriptors, with the ids of a running cluster, empty ones and extreme numbers.
"""

from __future__ import annotations

import math

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.core import Refused, Reject, Scheduler
from libs.events import DecodeError, decode, encode, new_envelope
from libs.events.convert import to_input
from libs.events.log_step import step
from tests.builders import proto_workflow

# Names the cluster below knows (a node, a job, its task, and the empty name an unset
# field reads as) half of the time; ones nobody knows otherwise.
TEXT = st.one_of(
    st.sampled_from(["", "n0", "j-1", "j-1/0", "w-1", "w-1/a", "a", "m-a"]),
    st.sampled_from(["a", "u", "default", "ghost", "../..", "\x00", "é" * 3]),
)
NUMBERS = {
    "int": [0, 1, -1, 8, 1000, 2**31 - 1, -(2**31)],
    "int64": [0, 1, -1, 8, 2**63 - 1, -(2**63)],
    "uint": [0, 1, 8, 1000, 2**32 - 1],
    "uint64": [0, 1, 8, 2**64 - 1],
    "float": [0.0, 1.0, -1.0, 0.5, 1e308, -1e308, math.inf, -math.inf, math.nan, 5e-324],
}
_KIND = {
    FieldDescriptor.TYPE_INT32: "int",
    FieldDescriptor.TYPE_SINT32: "int",
    FieldDescriptor.TYPE_SFIXED32: "int",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_SINT64: "int64",
    FieldDescriptor.TYPE_SFIXED64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint",
    FieldDescriptor.TYPE_FIXED32: "uint",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_FIXED64: "uint64",
    FieldDescriptor.TYPE_DOUBLE: "float",
    FieldDescriptor.TYPE_FLOAT: "float",
}
# Seconds of Timestamps and Durations: ordinary, at and past the types' ends.
SECONDS = [0, 1, 60, -1, 1_800_000_000, 253_402_300_799, 315_576_000_000, 10**13, -(10**13)]
PAYLOADS = [f.message_type for f in events_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields]


def _scalar(draw: st.DrawFn, field: FieldDescriptor) -> object:
    if field.type == FieldDescriptor.TYPE_STRING:
        return draw(TEXT)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if field.type == FieldDescriptor.TYPE_BYTES:
        return draw(st.sampled_from([b"", b"\x00", b"x" * 10]))
    if field.type == FieldDescriptor.TYPE_ENUM:
        return draw(st.sampled_from([v.number for v in field.enum_type.values] + [99]))
    return draw(st.sampled_from(NUMBERS[_KIND[field.type]]))


def _fill(draw: st.DrawFn, message: Message, depth: int) -> None:
    descriptor: Descriptor = message.DESCRIPTOR
    if descriptor.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        message.seconds = draw(st.sampled_from(SECONDS))  # type: ignore[attr-defined]
        message.nanos = draw(st.sampled_from([0, 1, 999_999_999, -1]))  # type: ignore[attr-defined]
        return
    for field in descriptor.fields:
        count = draw(st.integers(0, 2)) if field.is_repeated else draw(st.integers(0, 1))
        for _ in range(count):
            value = getattr(message, field.name)
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                scalar = _scalar(draw, field)
                if field.is_repeated:
                    value.append(scalar)
                else:
                    setattr(message, field.name, scalar)
            elif field.message_type.GetOptions().map_entry:
                key = draw(TEXT)
                entry = field.message_type.fields_by_name["value"]
                if entry.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < 4:
                        _fill(draw, value[key], depth + 1)
                else:
                    value[key] = _scalar(draw, entry)
            elif depth < 4:
                _fill(draw, value.add() if field.is_repeated else value, depth + 1)


@st.composite
def envelopes(draw: st.DrawFn) -> events_pb2.Envelope:
    payload_type = draw(st.sampled_from(PAYLOADS))
    payload = getattr(events_pb2, payload_type.name)()
    _fill(draw, payload, 0)
    env = new_envelope(payload, producer="fuzz", cluster="default")
    if draw(st.booleans()):
        _fill(draw, env.occurred_at, 0)
    return env


def _running_cluster() -> Scheduler:
    """Two GPUs of node n0: batch job j-1 (task j-1/0) and workflow w-1's first task
    (w-1/a) run there, j-2 waits."""
    scheduler = Scheduler()
    inventory = types_pb2.NodeInventory(
        node_id="n0",
        gpus=[types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30) for i in (0, 1)],
    )
    batch = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"])
    workflow = proto_workflow(("a", []), ("b", ["a"]))
    serving = types_pb2.JobSpec(allocation="a", user="u", gpus=1, workflow=workflow)
    for payload in (
        events_pb2.NodeRegistered(inventory=inventory),
        events_pb2.JobAdmitted(job_id="j-1", spec=batch),
        events_pb2.JobAdmitted(job_id="w-1", spec=serving),
        events_pb2.JobAdmitted(job_id="j-2", spec=batch),
    ):
        step(scheduler, new_envelope(payload, producer="setup"))
    return scheduler


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(), min_size=1, max_size=4))
def test_no_envelope_that_decodes_makes_the_core_raise(envs: list[events_pb2.Envelope]) -> None:
    scheduler = _running_cluster()
    for env in envs:
        try:
            core_input = to_input(decode(encode(env)))
        except DecodeError:
            continue  # dead-lettered: placement never decides it
        if core_input is not None and not isinstance(core_input, Reject | Refused):
            scheduler.handle(core_input)  # a raise here is a defect (and a half-written state)
    assert scheduler.digest() == scheduler.recomputed_digest()
