"""Traces across the stack's processes, read from their logs (``OTEL_TRACES_EXPORTER=
console``): one trace runs from a submit through Kafka to the node agent, with producer
and consumer spans on each hop; the ticker's ticks are sampled out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.bus import load_topic_config
from libs.bus.producer import TYPE_HEADER
from tests.integration.conftest import eventually, read_topic, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit

Span = dict[str, Any]
SERVICES = ("admission", "placement", "node_agent", "ticker")


def spans(stack: Stack, service: str) -> list[Span]:
    """The spans ``service`` has exported so far, each tagged with ``service``."""
    found = []
    for line in (stack.logs / f"{service}.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and '"trace_id"' in line:
            found.append({**json.loads(line), "service": service})
    return found


def ancestry(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """``span`` and each of its ancestors, ``span`` first."""
    chain = [span]
    while span["parent_id"] is not None:
        span = by_id[span["parent_id"]]
        chain.append(span)
    return chain


def described(span: Span) -> tuple[str, str, str]:
    return span["service"], span["kind"].removeprefix("SpanKind."), span["name"]


def test_one_trace_runs_from_submit_through_kafka_to_the_node_agents_report(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submit(stack, jobs, command=["true"])
    wait_for_end(stack, jobs, job_id)

    def run_span() -> Span | None:
        return next(
            (
                span
                for span in spans(stack, "node_agent")
                if span["name"] == "run task" and span["attributes"]["qm.job_id"] == job_id
            ),
            None,
        )

    run = eventually(run_span, what=f"the node agent's span for {job_id}")
    every = [span for service in SERVICES for span in spans(stack, service)]
    by_id = {span["context"]["span_id"]: span for span in every}
    topics = load_topic_config(Path(stack.topics_file))
    events, decisions = topics.events.name, topics.decisions.name
    spans_up = ancestry(run, by_id)
    assert {span["context"]["trace_id"] for span in spans_up} == {run["context"]["trace_id"]}
    chain = [described(span) for span in spans_up]
    # Placement's span is named for the record it decided on.
    assert chain[3][:2] == ("placement", "INTERNAL") and chain[3][2].startswith("placement ")
    assert chain[:3] + chain[4:] == [
        ("node_agent", "INTERNAL", "run task"),
        ("node_agent", "CONSUMER", f"{decisions} receive"),
        ("placement", "PRODUCER", f"{decisions} send"),
        ("placement", "CONSUMER", f"{events} receive"),
        ("admission", "PRODUCER", f"{events} send"),
        ("admission", "SERVER", "/qm.v1.JobService/SubmitJob"),
    ]
    reports = [
        span
        for span in every
        if span["parent_id"] == run["context"]["span_id"] and span["kind"] == "SpanKind.PRODUCER"
    ]
    # Its start and end, reported inside the run's span.
    assert len(reports) == 2 and {span["name"] for span in reports} == {f"{events} send"}


def test_ticks_are_sampled_out(stack: Stack) -> None:
    ticks = [r for r in read_topic(stack, "events") if (TYPE_HEADER, b"clock_tick") in r.headers]
    assert ticks, "the ticker ticks"
    placement = spans(stack, "placement")
    assert placement, "placement's spans are exported"
    assert [span for span in placement if span["name"] == "placement clock_tick"] == []
    assert spans(stack, "ticker") == []
