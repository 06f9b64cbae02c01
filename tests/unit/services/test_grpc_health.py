"""Health/Watch, a server-streaming RPC, works on a traced server: watchers hear SERVING,
then each change, down to NOT_SERVING when the service stops; other calls are traced."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from qm.v1 import job_service_pb2, job_service_pb2_grpc, types_pb2

from services.grpc_server import serve_until_cancelled

SERVICE = job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Jobs(job_service_pb2_grpc.JobServiceServicer):
    async def GetJob(
        self, request: job_service_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.GetJobResponse:
        return job_service_pb2.GetJobResponse(job=types_pb2.Job(job_id=request.job_id))


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on: the process's tracer provider (made here if none is) exports here."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[grpc.aio.Channel, asyncio.Task[None]]]:
    """A service run as in production (``serve_until_cancelled``), a channel to it, and
    the task to cancel to stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    def register(server: grpc.aio.Server) -> None:
        job_service_pb2_grpc.add_JobServiceServicer_to_server(Jobs(), server)

    service = asyncio.create_task(serve_until_cancelled(address, [register], [SERVICE]))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            await asyncio.wait_for(channel.channel_ready(), 5)
            yield channel, service
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)


def watch(channel: grpc.aio.Channel) -> grpc.aio.UnaryStreamCall:
    return health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE))


async def test_watch_hears_serving_then_not_serving_when_the_service_stops(
    spans: InMemorySpanExporter,
) -> None:
    async with serving() as (channel, service):
        statuses = watch(channel)
        assert (await asyncio.wait_for(statuses.read(), 5)).status == SERVING
        service.cancel()
        assert (await asyncio.wait_for(statuses.read(), 5)).status == NOT_SERVING


async def test_calls_are_traced_and_health_probes_are_not(spans: InMemorySpanExporter) -> None:
    spans.clear()
    async with serving() as (channel, _):
        statuses = watch(channel)
        assert (await asyncio.wait_for(statuses.read(), 5)).status == SERVING
        statuses.cancel()
        health = health_pb2_grpc.HealthStub(channel)
        checked = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert checked.status == SERVING
        reply = await job_service_pb2_grpc.JobServiceStub(channel).GetJob(
            job_service_pb2.GetJobRequest(job_id="j-1")
        )
        assert reply.job.job_id == "j-1"
    assert [(span.name, span.kind) for span in spans.get_finished_spans()] == [
        (f"/{SERVICE}/GetJob", SpanKind.SERVER)
    ]
