"""File names for ids: the agent names task logs and scratch folders after job and task
ids, which it does not choose, so that no id can name a path outside its folder."""

from __future__ import annotations

import hashlib

# Longest escaped name kept readable; a longer one is replaced by its digest.
_MAX_NAME = 200
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


def safe_name(text: str) -> str:
    """A file name for an id, one to one: bytes other than letters, digits, ``-``, ``_``
    and a ``.`` not in front are written ``%XX``; a name that would be too long is
    ``~`` and its SHA-256 (``~`` appears in no escaped name). Never empty, never ``.``
    or ``..``, never with a ``/``."""
    raw = text.encode()
    escaped = "".join(
        chr(byte) if byte in _SAFE and (index or byte != ord(".")) else f"%{byte:02X}"
        for index, byte in enumerate(raw)
    )
    if not escaped or len(escaped) > _MAX_NAME:
        return "~" + hashlib.sha256(raw).hexdigest()
    return escaped
