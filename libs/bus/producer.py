"""An idempotent (acks=all) producer of envelopes, optionally transactional."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer
from qm.v1 import events_pb2

from libs.bus.settings import KafkaSettings
from libs.events import encode, event_type
from libs.telemetry import inject_context

TYPE_HEADER = "qm-type"


class EventProducer:
    def __init__(
        self,
        settings: KafkaSettings,
        *,
        client_id: str,
        transactional_id: str | None = None,
        linger_ms: int = 2,
    ) -> None:
        self._producer = AIOKafkaProducer(
            **settings.client_kwargs(),
            client_id=client_id,
            enable_idempotence=True,
            acks="all",
            transactional_id=transactional_id,
            linger_ms=linger_ms,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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

    async def enqueue(self, topic: str, env: events_pb2.Envelope, *, key: str | None = None) -> Any:
        """Queue one envelope; the returned future resolves on acknowledgement."""
        headers = inject_context([(TYPE_HEADER, event_type(env).encode())])
        return await self._producer.send(
            topic,
            value=encode(env),
            key=(key if key is not None else env.cluster).encode(),
            headers=headers,
        )

    async def send_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> None:
        await (await self._producer.send(topic, value=value, key=key, headers=headers))

    @property
    def kafka(self) -> AIOKafkaProducer:
        """The underlying producer, for transactions."""
        return self._producer
