"""Admission's surroundings in memory: the caller, the log, the budget, the projector."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from aiokafka.structs import RecordMetadata, TopicPartition
from qm.v1 import events_pb2, types_pb2

from libs.auth import issue_token
from libs.config.budget import tree_from_mapping
from libs.core import Limits, PolicyConfig
from services.admission.explainer import Explainer
from services.admission.requests import RequestLog
from services.admission.servicer import JobServicer
from services.projector.client import ProjectorUnavailable

SECRET = b"test-secret"
TREE = tree_from_mapping(
    {
        "name": "root",
        "children": [{"name": "team-a", "members": ["alice"]}, {"name": "team-b"}],
    }
)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class Context:
    def __init__(self, user: str = "alice") -> None:
        self.user = user

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {issue_token(self.user, SECRET)}")]

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class MemoryLog:
    """The events topic as a list: the producer appends to it and the follower reads it
    back to the views, every record as soon as it is written (unless ``down``)."""

    def __init__(self, views: list[Any] | None = None) -> None:
        self.sent: list[events_pb2.Envelope] = []
        self.views = views or []
        self.down = False  # the broker takes records but never acknowledges them

    async def enqueue(self, topic: str, env: events_pb2.Envelope, *, key: str) -> Any:
        written = asyncio.get_running_loop().create_future()
        if self.down:
            return written
        offset = len(self.sent)
        self.sent.append(env)
        for view in self.views:
            view(env)
        written.set_result(RecordMetadata(topic, 0, TopicPartition(topic, 0), offset, -1, 0, 0))
        return written

    async def reached(self, tp: TopicPartition, offset: int) -> None:
        assert offset < len(self.sent)


class Budget:
    async def tree(self) -> Any:
        return TREE


class Projector:
    def __init__(self, nodes: list[types_pb2.Node] | None = None, down: bool = False) -> None:
        self.nodes = nodes or []
        self.down = down
        self.asked: list[str] = []

    async def get_job(self, job_id: str) -> None:
        return None

    async def list_nodes(self, cluster: str = "") -> list[types_pb2.Node]:
        self.asked.append(cluster)
        if self.down:
            raise ProjectorUnavailable("projector at http://x unreachable")
        return self.nodes


def servicer(
    log: MemoryLog, projector: Projector | None = None, limits: Limits | None = None
) -> JobServicer:
    """Admission over the in-memory log: its request log is one of the log's views."""
    requests = RequestLog()
    log.views.append(requests.apply)
    return JobServicer(
        producer=log,  # type: ignore[arg-type]
        topic="qm.events",
        budget=Budget(),  # type: ignore[arg-type]
        projector=projector or Projector(),  # type: ignore[arg-type]
        limits=limits or Limits(),
        secret=SECRET,
        explainer=Explainer(PolicyConfig()),
        requests=requests,
        follower=log,  # type: ignore[arg-type]
    )
