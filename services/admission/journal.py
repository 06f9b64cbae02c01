"""What admission records in the event log, and what it recorded lately."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

import grpc
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventProducer
from libs.core.limits import (
    MAX_REASON_CHARS,
)
from libs.events import new_envelope
from services.status import Unavailable

log = logging.getLogger("admission")

PRODUCER = "admission"


# How long the broker may take to write a record, or to show it back: past that the
# call fails UNAVAILABLE (the CLI retries) instead of running into the client's deadline.
LOG_TIMEOUT_S = 5.0


class Journal:
    """What admission writes to the event log (``record``), and the jobs it recorded
    lately, for read-your-writes until the projector has them (``recent``)."""

    def __init__(self, producer: EventProducer, topic: str) -> None:
        self._producer = producer
        self._topic = topic
        self._recent: OrderedDict[str, types_pb2.Job] = OrderedDict()

    def recent(self, job_id: str) -> types_pb2.Job | None:
        return self._recent.get(job_id)

    def recent_jobs(self) -> list[types_pb2.Job]:
        return list(self._recent.values())

    def remember(self, job: types_pb2.Job) -> None:
        self._recent[job.job_id] = job
        if len(self._recent) > 10_000:
            self._recent.popitem(last=False)

    async def reject(
        self,
        job_id: str,
        spec: types_pb2.JobSpec,
        field: str,
        reason: str,
        *,
        status: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        record_spec: bool = True,
    ) -> None:
        rejected = events_pb2.JobRejected(
            job_id=job_id, field=field, reason=_cut(reason), status=status.name
        )
        if record_spec:
            rejected.spec.CopyFrom(spec)
        await self.record([rejected], job_id, spec.cluster or "default")

    async def record(
        self, payloads: list[Message], job_id: str, cluster: str
    ) -> list[tuple[events_pb2.Envelope, RecordMetadata]]:
        """Append events in order; return each with where the broker wrote it, once it
        has all. A broker that does not answer in time makes the call UNAVAILABLE."""
        acks = []
        envelopes: list[events_pb2.Envelope] = []
        try:
            for payload in payloads:
                env = new_envelope(
                    payload,
                    producer=PRODUCER,
                    cluster=cluster,
                    correlation_id=job_id,
                    causation_id=envelopes[-1].event_id if envelopes else "",
                )
                envelopes.append(env)
                acks.append(await self._producer.enqueue(self._topic, env, key=cluster))
            written = await asyncio.wait_for(asyncio.gather(*acks), LOG_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            raise Unavailable(
                f"the event log (Kafka) did not take the record in {LOG_TIMEOUT_S:g} s "
                f"({type(exc).__name__})"
            ) from None
        return list(zip(envelopes, written, strict=True))


def _cut(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"
