"""The one place aiokafka clients are built: where the cluster is, how to authenticate,
and the options every Quartermaster client shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from libs.bus.ports import OffsetReset
from libs.bus.settings import KafkaSettings

# How often a consumer reads the cluster metadata again (see ``KafkaBus.consumer``).
METADATA_MAX_AGE_MS = 10_000


@dataclass(frozen=True)
class KafkaBus:
    """A ``libs.bus.ports.Bus`` over a Kafka cluster; returns aiokafka's own clients."""

    settings: KafkaSettings

    # ``options``: aiokafka's own (a group or transactional id, tuning), passed as they are.

    def consumer(
        self,
        *,
        client_id: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        **options: Any,
    ) -> AIOKafkaConsumer:
        """Committed records only (``read_committed``), so that placement's transactional
        output is seen exactly once, all or nothing; offsets are committed by the caller,
        once it has acted on the records."""
        return AIOKafkaConsumer(
            **self.settings.client_kwargs(),
            **({"client_id": client_id} if client_id else {}),
            auto_offset_reset=auto_offset_reset,
            enable_auto_commit=False,
            isolation_level="read_committed",
            # A consumer that joined its group while the broker knew none of its topics'
            # partitions (it was starting) is assigned nothing until its metadata is
            # read again: within seconds, not aiokafka's default five minutes.
            metadata_max_age_ms=METADATA_MAX_AGE_MS,
            **options,
        )

    def producer(self, *, client_id: str | None = None, **options: Any) -> AIOKafkaProducer:
        """Idempotent and acknowledged by every replica: a retried send is not doubled."""
        return AIOKafkaProducer(
            **self.settings.client_kwargs(),
            **({"client_id": client_id} if client_id else {}),
            enable_idempotence=True,
            acks="all",
            **options,
        )

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self.settings.client_kwargs())
