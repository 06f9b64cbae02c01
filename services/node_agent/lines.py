"""A task's stdout and stderr merged into one log in whole lines (a pure state machine).

Each stream comes through a pipe of its own, in pieces that need not end at a line's
end. A stream's complete lines go to the log as they come; its unfinished line waits
for the rest, unless it outgrows ``bound`` or the shell flushes it (the stream ended,
or went quiet: a prompt, a progress bar). Once a stream's unfinished line is in the log,
the next write of the other stream starts on a new line; so a line of one stream never
lands inside a line of the other. A carriage return ends a line too (progress bars).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENDS = (b"\n", b"\r")
DEFAULT_BOUND = 64 * 1024


@dataclass
class LineJoiner:
    """Whole lines of several streams, by name; ``bound``: the longest unfinished line
    held back."""

    bound: int = DEFAULT_BOUND
    _held: dict[str, bytes] = field(default_factory=dict)
    # The stream whose unfinished line the log ends with; None: the log is at a line start.
    _open: str | None = None

    def feed(self, stream: str, data: bytes) -> bytes:
        """What to append to the log now that ``stream`` wrote ``data``."""
        held = self._held.get(stream, b"") + data
        cut = max(held.rfind(end) for end in ENDS) + 1
        ready, rest = held[:cut], held[cut:]
        if len(rest) > self.bound:
            ready, rest = held, b""
        self._held[stream] = rest
        return self._emit(stream, ready)

    def flush(self, stream: str) -> bytes:
        """What to append for ``stream``'s unfinished line (it ended, or went quiet)."""
        return self._emit(stream, self._held.pop(stream, b""))

    def holds(self, stream: str) -> bool:
        """Whether ``stream`` has an unfinished line held back."""
        return bool(self._held.get(stream))

    def _emit(self, stream: str, ready: bytes) -> bytes:
        if not ready:
            return b""
        # Another stream's unfinished line is in the log: end it first.
        prefix = b"\n" if self._open not in (None, stream) else b""
        self._open = None if ready.endswith(ENDS) else stream
        return prefix + ready
