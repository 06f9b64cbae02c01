"""The run's gRPC clients: asyncio channels that reconnect fast after a kill."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from qm.v1 import budget_service_pb2_grpc as bs_grpc
from qm.v1 import cluster_service_pb2_grpc as cs_grpc
from qm.v1 import job_service_pb2_grpc as js_grpc

from tests.chaos.stack import ChaosStack

# A restarted service is found within a second, not after gRPC's default backoff
# (up to two minutes); requests up to 64 MB leave the client, so that the server's
# own limit is what answers an oversized one.
OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


@dataclass
class Clients:
    jobs: js_grpc.JobServiceStub
    cluster: cs_grpc.ClusterServiceStub
    budget: bs_grpc.BudgetServiceStub
    _channels: tuple[grpc.aio.Channel, ...]

    @classmethod
    def connect(cls, stack: ChaosStack) -> Clients:
        admission = grpc.aio.insecure_channel(f"127.0.0.1:{stack.admission_port}", OPTIONS)
        budget = grpc.aio.insecure_channel(f"127.0.0.1:{stack.budget_port}", OPTIONS)
        return cls(
            js_grpc.JobServiceStub(admission),
            cs_grpc.ClusterServiceStub(admission),
            bs_grpc.BudgetServiceStub(budget),
            (admission, budget),
        )

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
