"""One log format for every service, through structlog: the standard library's records
(ours and the libraries') rendered as lines for people (``text``) or as JSON objects
for a log pipeline (``json``), each with the service, and the trace and span it was
written in, so that a log line leads to its trace. A line never carries a token: one that
a library logs (in a request it echoes, an error it explains) is written as ``[token]``."""

from __future__ import annotations

import logging
import re
from typing import Literal

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor, WrappedLogger

LogFormat = Literal["text", "json"]
# A JWT: its header and payload are base64url JSON ('{"' is "eyJ"), then its signature.
TOKEN_PATTERN = r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*)?"
_TOKEN = re.compile(TOKEN_PATTERN)


def configure_logs(service: str, level: str = "INFO", form: LogFormat = "text") -> None:
    """Send every record of the process, at ``level`` and up, to stderr as ``form``."""
    shared: list[Processor] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add(service=service),
        _trace_ids,
    ]
    renderer = (
        structlog.processors.JSONRenderer()
        if form == "json"
        else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)
    )
    formatter = _Redacting(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The Kafka clients narrate every rebalance at INFO; keep their warnings only.
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def redact(line: str) -> str:
    """``line`` with every token in it replaced by ``[token]``."""
    return _TOKEN.sub("[token]", line)


class _Redacting(structlog.stdlib.ProcessorFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _add(**fields: str) -> Processor:
    def add(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
        event.update(fields)
        return event

    return add


def _trace_ids(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
    """The trace and span the record was written in, as OTLP writes them (hex)."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event["trace_id"] = format(context.trace_id, "032x")
        event["span_id"] = format(context.span_id, "016x")
    return event
