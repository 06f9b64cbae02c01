"""Admission's surroundings in memory: the caller, the log (on the memory bus), the budget,
the projector; and a submission through them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js

from libs.auth import Keys, SigningKey, issue_token
from libs.bus import EventProducer
from libs.bus.memory import MemoryBus
from libs.config.budget import tree_from_mapping
from libs.core import Limits, PolicyConfig
from libs.events import event_type
from libs.readmodels import JobFilter, Scope, newest_jobs
from services.admission.explainer import Explainer
from services.admission.follower import Follower
from services.admission.requests import RequestLog
from services.admission.servicer import JobServicer
from services.admission.tasklogs import TaskLogReader
from services.projector.client import ProjectorUnavailable
from services.tls import TlsSettings

SIGNER = SigningKey.generate()
KEYS = Keys.trusting(SIGNER)
TOPIC = "qm.events"
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
        return [("authorization", f"Bearer {issue_token(self.user, SIGNER)}")]

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def memory_log() -> MemoryBus:
    """The events topic, in memory."""
    return MemoryBus({TOPIC: 1})


class Budget:
    async def tree(self) -> Any:
        return TREE


class Projector:
    def __init__(
        self,
        nodes: list[types_pb2.Node] | None = None,
        down: bool = False,
        jobs: list[types_pb2.Job] | None = None,
    ) -> None:
        self.nodes = nodes or []
        self.down = down
        self.jobs = {job.job_id: job for job in jobs or []}
        self.asked: list[str] = []

    async def get_job(self, job_id: str) -> types_pb2.Job | None:
        return self.jobs.get(job_id)

    async def list_jobs(
        self, where: JobFilter, limit: int, scope: Scope | None = None
    ) -> list[types_pb2.Job]:
        return newest_jobs(self.jobs.values(), where=where, limit=limit, scope=scope)

    async def list_nodes(self, cluster: str = "") -> list[types_pb2.Node]:
        self.asked.append(cluster)
        if self.down:
            raise ProjectorUnavailable("projector at http://x unreachable")
        return self.nodes


@asynccontextmanager
async def servicer(
    log: MemoryBus, projector: Projector | None = None, limits: Limits | None = None
) -> AsyncIterator[JobServicer]:
    """Admission over the in-memory bus, its producer and follower as in production."""
    requests, explainer = RequestLog(), Explainer(PolicyConfig())
    producer = EventProducer(log, client_id="admission")
    follower = Follower(log, TOPIC, [explainer.apply, requests.apply])
    await producer.start()
    await follower.start()
    try:
        yield JobServicer(
            producer=producer,
            topic=TOPIC,
            budget=Budget(),  # type: ignore[arg-type]
            projector=projector or Projector(),  # type: ignore[arg-type]
            limits=limits or Limits(),
            keys=KEYS,
            explainer=explainer,
            requests=requests,
            follower=follower,
            logs=TaskLogReader(lambda: "no agents here", TlsSettings()),
        )
    finally:
        await follower.stop()
        await producer.stop()


GB = 1_000_000_000


def node(
    node_id: str, gpu_type: str, memory_gb: int, gpus: int = 2, **inventory: Any
) -> types_pb2.Node:
    """A node as the projector lists it; ``inventory``: more of its ``NodeInventory``."""
    listed = types_pb2.NodeInventory(
        node_id=node_id,
        cluster="default",
        gpus=[
            types_pb2.Gpu(index=i, type=gpu_type, memory_bytes=memory_gb * GB) for i in range(gpus)
        ],
        **inventory,
    )
    return types_pb2.Node(inventory=listed)


CLUSTER = [node("n1", "T4", 16), node("n2", "H100", 80)]


async def submit(
    spec: types_pb2.JobSpec, projector: Projector | None = None, limits: Limits | None = None
) -> tuple[js.SubmitJobResponse | Aborted, list[events_pb2.Envelope]]:
    """Alice submits ``spec`` (to ``CLUSTER`` unless ``projector`` lists others): the
    answer, and what went into the log."""
    log = memory_log()
    async with servicer(log, projector or Projector(CLUSTER), limits) as service:
        try:
            reply: js.SubmitJobResponse | Aborted = await service.SubmitJob(
                js.SubmitJobRequest(spec=spec),
                Context(),  # type: ignore[arg-type]
            )
        except Aborted as exc:
            reply = exc
    return reply, log.envelopes(TOPIC)


async def rejected(
    spec: types_pb2.JobSpec, projector: Projector | None = None, limits: Limits | None = None
) -> tuple[Aborted, events_pb2.JobRejected]:
    """``submit``, refused: the answer and the one record of it."""
    reply, sent = await submit(spec, projector, limits)
    assert isinstance(reply, Aborted)
    assert [event_type(e) for e in sent] == ["job_rejected"]  # and nothing else
    return reply, sent[0].job_rejected
