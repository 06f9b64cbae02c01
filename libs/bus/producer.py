"""Send envelopes: encoded, keyed by cluster, typed in their headers (the aiokafka
instrumentation adds the trace context, ``libs.telemetry.kafka``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from aiokafka.structs import RecordMetadata
from qm.v1 import events_pb2

from libs.bus.ports import Bus, Producer
from libs.events import encode, event_type
from libs.telemetry import sending

TYPE_HEADER = "qm-type"


class Sealer(Protocol):
    """Signs what a writer sends (``libs/trust/keys.py``): the record's bytes."""

    def seal(self, env: events_pb2.Envelope) -> bytes: ...


class EventProducer:
    """Wraps one producer of a bus; transactional when given a ``transactional_id``;
    each envelope signed by ``sealer`` when given one (a writer of the event log)."""

    def __init__(
        self,
        bus: Bus,
        *,
        client_id: str,
        transactional_id: str | None = None,
        linger_ms: int = 2,
        sealer: Sealer | None = None,
    ) -> None:
        self._producer = bus.producer(
            client_id=client_id, transactional_id=transactional_id, linger_ms=linger_ms
        )
        self._sealer = sealer

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def send(
        self,
        topic: str,
        env: events_pb2.Envelope,
        *,
        key: str | None = None,
    ) -> None:
        """Send one envelope and wait until the broker has it."""
        future = await self.enqueue(topic, env, key=key)
        await future

    async def enqueue(
        self, topic: str, env: events_pb2.Envelope, *, key: str | None = None
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one envelope; the returned future resolves on acknowledgement."""
        kind = event_type(env)
        with sending(kind):
            return await self._producer.send(
                topic,
                value=self._sealer.seal(env) if self._sealer is not None else encode(env),
                key=(key if key is not None else env.cluster).encode(),
                # A list: the instrumentation appends the trace context to it.
                headers=[(TYPE_HEADER, kind.encode())],
            )

    async def send_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        # A copy, as a list: the instrumentation appends the trace context to it.
        await (await self._producer.send(topic, value=value, key=key, headers=list(headers)))

    @property
    def client(self) -> Producer:
        """The underlying producer, for transactions."""
        return self._producer
