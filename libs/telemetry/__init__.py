"""OpenTelemetry setup and trace-context propagation through Kafka headers."""

from libs.telemetry.propagation import extract_context, inject_context
from libs.telemetry.tracing import setup_tracing

__all__ = ["extract_context", "inject_context", "setup_tracing"]
