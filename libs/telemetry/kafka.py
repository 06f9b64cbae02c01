"""Kafka spans come from the OpenTelemetry aiokafka instrumentation: a producer span per
record sent, its context in the record's headers (W3C ``traceparent``), and a consumer
span per record received, child of its producer's.

The instrumentation ends a consumer span as ``getmany`` returns, before the record is
acted on; ``processing_context`` gives the context to act on it in, so that what a
service does with a record (and sends because of it) is a child of its consumer span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.aiokafka import AIOKafkaInstrumentor
from opentelemetry.trace import Span, TracerProvider

# Where the consume hook leaves a record's consumer span: the record is all that travels
# from the instrumented ``getmany`` to the code that acts on it.
_CONSUMER_CONTEXT = "_qm_consumer_context"


async def _remember_consumer_span(span: Span, record: Any, *_: Any) -> None:
    setattr(record, _CONSUMER_CONTEXT, trace.set_span_in_context(span))


def instrument_kafka(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every aiokafka producer and consumer of this process (once; again is a no-op)."""
    AIOKafkaInstrumentor().instrument(
        tracer_provider=tracer_provider, async_consume_hook=_remember_consumer_span
    )


def processing_context(record: object) -> Context:
    """The context to act on ``record`` in: under its consumer span. Empty (a new trace)
    for a record no instrumented consumer received (tracing off, the in-memory bus)."""
    found = getattr(record, _CONSUMER_CONTEXT, None)
    return found if isinstance(found, Context) else Context()
