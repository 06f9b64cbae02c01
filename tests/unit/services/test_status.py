"""What escapes a servicer reaches the caller as a status it can act on, never UNKNOWN;
and that status is the one counted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import REGISTRY
from qm.v1 import job_service_pb2, job_service_pb2_grpc, types_pb2

from services.grpc_server import start_server
from services.projector.client import ProjectorUnavailable
from services.status import Unavailable

SERVICE = job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name


class Failing(job_service_pb2_grpc.JobServiceServicer):
    async def GetJob(
        self, request: job_service_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.GetJobResponse:
        raise {
            "broker": Unavailable("the event log is down"),
            "projector": ProjectorUnavailable("projector at http://x unreachable"),
            "bug": ZeroDivisionError("oops"),
        }[request.job_id]

    async def CancelJob(
        self, request: job_service_pb2.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.CancelJobResponse:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        raise AssertionError("unreachable")

    async def WatchJob(
        self, request: job_service_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[job_service_pb2.WatchJobResponse]:
        yield job_service_pb2.WatchJobResponse(job=types_pb2.Job(job_id=request.job_id))
        raise Unavailable("the projector went away")


@pytest.fixture
async def stub() -> AsyncIterator[job_service_pb2_grpc.JobServiceStub]:
    server, port = await start_server(
        "127.0.0.1:0",
        [lambda s: job_service_pb2_grpc.add_JobServiceServicer_to_server(Failing(), s)],
        [SERVICE],
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield job_service_pb2_grpc.JobServiceStub(channel)
    await server.stop(None)


@pytest.mark.parametrize(
    ("job_id", "code", "says"),
    [
        ("broker", grpc.StatusCode.UNAVAILABLE, "the event log is down; try again shortly"),
        ("projector", grpc.StatusCode.UNAVAILABLE, "projector at http://x unreachable"),
        ("bug", grpc.StatusCode.INTERNAL, "internal error (ZeroDivisionError)"),
    ],
)
async def test_a_failure_becomes_a_status(
    stub: job_service_pb2_grpc.JobServiceStub, job_id: str, code: grpc.StatusCode, says: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetJob(job_service_pb2.GetJobRequest(job_id=job_id))
    assert caught.value.code() == code and says in (caught.value.details() or "")


async def test_an_abort_keeps_its_own_status(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CancelJob(job_service_pb2.CancelJobRequest(job_id="j-1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_stream_that_fails_midway_ends_unavailable(
    stub: job_service_pb2_grpc.JobServiceStub,
) -> None:
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for change in stub.WatchJob(job_service_pb2.WatchJobRequest(job_id="j-1")):
            received.append(change.job.job_id)
    assert received == ["j-1"] and caught.value.code() == grpc.StatusCode.UNAVAILABLE


def calls(method: str, code: str) -> float:
    labels = {"method": f"/{SERVICE}/{method}", "code": code}
    return REGISTRY.get_sample_value("qm_grpc_requests_total", labels) or 0.0


async def test_each_call_is_counted_with_the_status_its_caller_got(
    stub: job_service_pb2_grpc.JobServiceStub,
) -> None:
    counted = [
        ("GetJob", "UNAVAILABLE"),
        ("GetJob", "INTERNAL"),
        ("CancelJob", "NOT_FOUND"),
        ("WatchJob", "UNAVAILABLE"),
    ]
    before = [calls(*key) for key in counted]
    for job_id in ("broker", "bug"):
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetJob(job_service_pb2.GetJobRequest(job_id=job_id))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.CancelJob(job_service_pb2.CancelJobRequest(job_id="j-1"))
    with pytest.raises(grpc.aio.AioRpcError):
        async for _ in stub.WatchJob(job_service_pb2.WatchJobRequest(job_id="j-1")):
            pass
    assert [calls(*key) - b for key, b in zip(counted, before, strict=True)] == [1.0] * 4
