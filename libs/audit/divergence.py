"""What a replay found wrong: the first decision that did not reproduce, and how."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.events import event_type

_RELEASE = types_pb2.Provenance.DESCRIPTOR.fields_by_name["release"]


class Difference(enum.Enum):
    PAYLOAD = "fields differ"
    DIGEST = "only the state digest differs"
    MISSING = "replay decided this, the log has no such decision"
    EXTRA = "the log has this decision, replay did not decide it"


@dataclass(frozen=True)
class Divergence:
    """The first decision that did not reproduce.

    ``index`` counts the decisions of one input record from 0. ``expected`` is
    None for an extra decision, ``recorded`` for a missing one; ``fields`` names
    the differing fields as dotted paths, e.g. ``task_placed.gpu_indices``.
    """

    partition: int
    input_offset: int
    index: int
    difference: Difference
    expected: events_pb2.Envelope | None
    recorded: events_pb2.Envelope | None
    fields: tuple[str, ...] = ()


def compare(
    expected: events_pb2.Envelope, recorded: events_pb2.Envelope
) -> tuple[Difference, tuple[str, ...]]:
    """How two envelopes whose bytes differ differ."""
    if event_type(expected) != event_type(recorded):
        return Difference.PAYLOAD, ("payload",)
    fields = tuple(_differing_fields(expected, recorded, ""))
    if len(fields) == 1 and fields[0].endswith(".provenance.state_digest"):
        return Difference.DIGEST, fields
    # Equal fields but unequal bytes: fields this build does not know (a newer writer).
    return Difference.PAYLOAD, fields or ("unknown fields",)


def _differing_fields(mine: Message, theirs: Message, prefix: str) -> list[str]:
    found = []
    for field in mine.DESCRIPTOR.fields:
        a, b = getattr(mine, field.name), getattr(theirs, field.name)
        if a == b or field is _RELEASE:  # the release is not replayed
            continue
        path = prefix + field.name
        if field.message_type is not None and not field.is_repeated:
            found.extend(_differing_fields(a, b, f"{path}."))
        else:
            found.append(path)
    return found
