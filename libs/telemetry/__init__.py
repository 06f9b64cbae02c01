"""OpenTelemetry setup: the tracer provider and its sampler, and Kafka's instrumentation."""

from libs.telemetry.kafka import instrument_kafka, processing_context
from libs.telemetry.sampling import ROUTINE_EVENTS, RoutineTrafficSampler, replaying, sending
from libs.telemetry.tracing import setup_tracing

__all__ = [
    "ROUTINE_EVENTS",
    "RoutineTrafficSampler",
    "instrument_kafka",
    "processing_context",
    "replaying",
    "sending",
    "setup_tracing",
]
