"""Which spans are kept: every trace but those of the log's routine traffic.

Ticks (``ClockTick``, many a minute) and node heartbeats are most of what crosses the
log and say nothing about a job; traced, they bury the traces that do. Their produce
spans are dropped, and with them everything downstream: the dropped span's context
still rides in the record's headers, unsampled, and a parent-based sampler drops every
span under it, in every service. Records read back to rebuild state (a service's
start-up replay of the whole log) are no step of their traces either.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

ROUTINE_EVENTS = frozenset({"clock_tick", "node_heartbeat"})

_EVENT_TYPE = context.create_key("qm.event_type")
_REPLAYING = context.create_key("qm.replaying")


@contextmanager
def sending(event_type: str) -> Iterator[None]:
    """Spans started inside send one event of ``event_type`` (an envelope's payload field,
    ``libs.events.event_type``). The aiokafka instrumentation starts its produce span
    with a name and kind only: this is how the sampler learns what the record is."""
    token = context.attach(context.set_value(_EVENT_TYPE, event_type))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def replaying() -> Iterator[None]:
    """Records received inside are folded into state, not acted on: no consumer spans."""
    token = context.attach(context.set_value(_REPLAYING, True))
    try:
        yield
    finally:
        context.detach(token)


class RoutineTrafficSampler(ParentBased):
    """Parent-based: a span follows its parent's decision and a new trace is kept, except

    - the spans of sending routine events (``ROUTINE_EVENTS``), whatever their parent;
    - a consumer span without a parent: the aiokafka instrumentation's per-poll spans
      (its per-record spans continue their producer's trace), which would otherwise
      start one trace per poll, each tick's included;
    - consumer spans while ``replaying``: the instrumentation parents a record's span on
      the context in its headers, so the flag is read from the current context.
    """

    def __init__(self) -> None:
        super().__init__(root=ALWAYS_ON)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if context.get_value(_EVENT_TYPE, parent_context) in ROUTINE_EVENTS:
            return SamplingResult(Decision.DROP)
        if kind is SpanKind.CONSUMER and (
            context.get_value(_REPLAYING)
            or not get_current_span(parent_context).get_span_context().is_valid
        ):
            return SamplingResult(Decision.DROP)
        return super().should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"RoutineTrafficSampler{{drops={','.join(sorted(ROUTINE_EVENTS))}}}"
