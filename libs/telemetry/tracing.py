"""One tracer provider per service, sampling out routine traffic
(``RoutineTrafficSampler``), with Kafka traced (``instrument_kafka``); the exporter is
chosen by environment.

``OTEL_TRACES_EXPORTER``: ``none`` (default), ``console`` or ``otlp`` (which
honours the standard ``OTEL_EXPORTER_OTLP_*`` variables). With ``none`` nothing is
traced at all: OpenTelemetry's no-op tracer stays in place and Kafka is not
instrumented, because recording spans that nobody exports cost a service a third of
its time per record (a profile of placement at 500 submissions/s).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from libs.config.document import ConfigError
from libs.telemetry.kafka import instrument_kafka
from libs.telemetry.sampling import RoutineTrafficSampler


def setup_tracing(service: str) -> TracerProvider:
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), sampler=RoutineTrafficSampler()
    )
    exporter = _exporter(os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower())
    if exporter is None:
        return provider  # not installed: the no-op tracer costs nothing
    if isinstance(exporter, ConsoleSpanExporter):
        # Synchronous, so that the last spans are in the log when a service stops.
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    instrument_kafka(provider)
    return provider


def _exporter(name: str) -> SpanExporter | None:
    if name in ("", "none"):
        return None
    if name == "console":
        return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + os.linesep)
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    raise ConfigError(
        f"environment: OTEL_TRACES_EXPORTER: expected none, console or otlp, got {name!r}"
    )
