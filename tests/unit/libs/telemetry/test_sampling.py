"""The sampler keeps every trace but routine traffic's, across a Kafka hop too: a dropped
produce span's context, in the record's headers, drops what the consumer does with it."""

from __future__ import annotations

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from libs.telemetry import ROUTINE_EVENTS, RoutineTrafficSampler, replaying, sending


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> Tracer:
    provider = TracerProvider(sampler=RoutineTrafficSampler())
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider.get_tracer("test")


def send(tracer: Tracer, event_type: str) -> dict[str, str]:
    """Send one record as the bus does (produce span inside ``sending``); its headers."""
    headers: dict[str, str] = {}
    with sending(event_type), tracer.start_as_current_span("events send", kind=SpanKind.PRODUCER):
        propagate.inject(headers)
    return headers


def consume(tracer: Tracer, headers: dict[str, str]) -> None:
    """Receive it as the aiokafka instrumentation does, and act on it under that span."""
    received = tracer.start_span(
        "events receive", context=propagate.extract(headers), kind=SpanKind.CONSUMER
    )
    received.end()
    with tracer.start_as_current_span("placement", context=trace.set_span_in_context(received)):
        send(tracer, "task_placed")


def ancestry(spans: tuple[ReadableSpan, ...], last: ReadableSpan) -> list[str]:
    """``last`` and its ancestors' names, ``last`` first."""
    by_id = {span.context.span_id: span for span in spans}
    names = [last.name]
    while last.parent is not None:
        last = by_id[last.parent.span_id]
        names.append(last.name)
    return names


@pytest.mark.parametrize("routine", sorted(ROUTINE_EVENTS))
def test_routine_traffic_is_dropped_in_every_span_it_causes(
    tracer: Tracer, spans: InMemorySpanExporter, routine: str
) -> None:
    headers = send(tracer, routine)
    flags = int(headers["traceparent"].rsplit("-", 1)[1], 16)
    assert not flags & 1, "the context travels on, unsampled"
    consume(tracer, headers)
    assert spans.get_finished_spans() == ()


def test_other_events_are_one_trace_from_send_to_what_the_consumer_sends(
    tracer: Tracer, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("SubmitJob", kind=SpanKind.SERVER):
        headers = send(tracer, "job_admitted")
    consume(tracer, headers)
    finished = spans.get_finished_spans()
    assert len({span.context.trace_id for span in finished}) == 1
    *_, decision = (span for span in finished if span.kind is SpanKind.PRODUCER)
    assert ancestry(finished, decision) == [
        "events send",  # placement's decision
        "placement",
        "events receive",
        "events send",  # admission's event
        "SubmitJob",
    ]


def test_a_poll_without_a_producer_starts_no_trace(
    tracer: Tracer, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("events receive", kind=SpanKind.CONSUMER) as poll:
        assert not poll.is_recording()
        with tracer.start_as_current_span("events receive", kind=SpanKind.CONSUMER) as topic:
            assert not topic.is_recording()
    with tracer.start_as_current_span("tick loop") as internal:
        assert internal.is_recording(), "a new trace of anything else is kept"
    assert [span.name for span in spans.get_finished_spans()] == ["tick loop"]


def test_records_read_back_to_rebuild_state_get_no_consumer_spans(
    tracer: Tracer, spans: InMemorySpanExporter
) -> None:
    headers = send(tracer, "job_admitted")
    with replaying():
        consume(tracer, headers)
    assert [span.name for span in spans.get_finished_spans()] == ["events send"]
