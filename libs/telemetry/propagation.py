"""Trace context rides in Kafka record headers (W3C traceparent)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import propagate
from opentelemetry.context import Context

Headers = list[tuple[str, bytes]]


def inject_context(headers: Headers) -> Headers:
    """Append the current span's context to ``headers`` and return them."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    headers.extend((key, value.encode()) for key, value in sorted(carrier.items()))
    return headers


def extract_context(headers: Sequence[tuple[str, bytes]] | None) -> Context:
    carrier = {key: value.decode(errors="replace") for key, value in headers or ()}
    return propagate.extract(carrier)
