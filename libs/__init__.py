"""Shared code: events, Kafka plumbing, the pure scheduling core, telemetry."""
