"""A real JobService in this process for qm to call: it records every request and can
fail the first N calls with UNAVAILABLE, as admission does while the stack restarts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2
from rich.console import Console


class RecordingJobs(js_grpc.JobServiceServicer):
    def __init__(self) -> None:
        self.requests: list[js.SubmitJobRequest] = []
        self.failures = 0  # calls to fail, from the first
        self.fail_with = grpc.StatusCode.UNAVAILABLE
        self.delay_s = 0.0  # before answering
        self.listed: list[types_pb2.Job] = []  # what ListJobs answers, GetJob looks in
        self.lists: list[js.ListJobsRequest] = []

    def SubmitJob(
        self, request: js.SubmitJobRequest, context: grpc.ServicerContext
    ) -> js.SubmitJobResponse:
        self.requests.append(request)
        time.sleep(self.delay_s)
        if len(self.requests) <= self.failures:
            context.abort(self.fail_with, "projector unreachable")
        if request.spec.HasField("array"):  # as admission names an array's elements
            return js.SubmitJobResponse(job_id=f"a-1_{request.spec.array.index}")
        return js.SubmitJobResponse(job_id="j-1")

    def ListJobs(
        self, request: js.ListJobsRequest, context: grpc.ServicerContext
    ) -> js.ListJobsResponse:
        self.lists.append(request)
        return js.ListJobsResponse(jobs=self.listed)

    def WatchJob(
        self, request: js.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[js.WatchJobResponse]:
        """Each listed state of the job, in order, then the stream ends."""
        listed = (job for job in self.listed if job.job_id == request.job_id)
        yield from (js.WatchJobResponse(job=job) for job in listed)

    def GetJob(self, request: js.GetJobRequest, context: grpc.ServicerContext) -> js.GetJobResponse:
        for job in self.listed:
            if job.job_id == request.job_id:
                return js.GetJobResponse(job=job)
        context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}")

    def StreamLogs(
        self, request: js.StreamLogsRequest, context: grpc.ServicerContext
    ) -> Iterator[js.StreamLogsResponse]:
        """As admission answers for a job whose tasks all ran on simulated nodes (this
        fake's nodes all are): FAILED_PRECONDITION, saying why there is no output."""
        job = self.GetJob(js.GetJobRequest(job_id=request.job_id), context).job
        nodes = dict.fromkeys(task.node_id for task in job.tasks if task.node_id)
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"job {job.job_id} has no output: it ran on simulated node(s) {', '.join(nodes)}, "
            "which run no command",
        )


class Admission:
    def __init__(self, jobs: RecordingJobs, address: str) -> None:
        self.jobs, self.address = jobs, address

    @property
    def env(self) -> dict[str, str]:
        """What qm needs to call this server."""
        return {"QM_ADDR": self.address, "QM_TOKEN": "qm1.test.token", "QM_TLS_CA": ""}


@pytest.fixture
def admission() -> Iterator[Admission]:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    jobs = RecordingJobs()
    js_grpc.add_JobServiceServicer_to_server(jobs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield Admission(jobs, f"127.0.0.1:{port}")
    finally:
        server.stop(grace=None)


def text(renderable: Any) -> str:
    """What a rich renderable prints, as plain text."""
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()
