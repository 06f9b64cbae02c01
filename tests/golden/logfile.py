"""Golden log files: envelopes, each prefixed with its length as a protobuf varint."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from qm.v1 import events_pb2

from libs.events import decode, encode


def write_log(path: Path, envelopes: Iterable[events_pb2.Envelope]) -> int:
    count = 0
    with path.open("wb") as out:
        for env in envelopes:
            data = encode(env)
            out.write(_varint(len(data)) + data)
            count += 1
    return count


def read_log(path: Path) -> Iterator[events_pb2.Envelope]:
    data = path.read_bytes()
    at = 0
    while at < len(data):
        size, at = _read_varint(data, at)
        yield decode(data[at : at + size])
        at += size


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
