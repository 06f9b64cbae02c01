"""Event log files: envelopes, each prefixed with its length as a protobuf varint.

The golden logs, recorded runs and simulator inputs all use this one format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from qm.v1 import events_pb2

from libs.events.envelope import DecodeError, decode, encode


def write_log(path: Path, envelopes: Iterable[events_pb2.Envelope]) -> int:
    """Write envelopes to ``path``; returns how many."""
    count = 0
    with path.open("wb") as out:
        for env in envelopes:
            data = encode(env)
            out.write(_varint(len(data)) + data)
            count += 1
    return count


def read_log(path: Path) -> Iterator[events_pb2.Envelope]:
    return read_envelopes(path.read_bytes())


def read_envelopes(data: bytes) -> Iterator[events_pb2.Envelope]:
    """Decode a whole log; a damaged record raises DecodeError naming its byte offset."""
    position = 0
    while position < len(data):
        length, start = _read_varint(data, position)
        end = start + length
        if end > len(data):
            raise DecodeError(f"record at byte {position} is cut short")
        try:
            yield decode(data[start:end])
        except DecodeError as exc:
            raise DecodeError(f"record at byte {position}: {exc}") from exc
        position = end


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while position < len(data):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise DecodeError("the log ends inside a record length")
