"""Records that cannot be decoded are parked, with the reason, and skipped."""

from __future__ import annotations

import logging

from libs.bus.ports import Located, Record
from libs.bus.producer import EventProducer

log = logging.getLogger(__name__)

REASON = "qm-dlq-reason"
SOURCE_TOPIC = "qm-dlq-topic"
SOURCE_PARTITION = "qm-dlq-partition"
SOURCE_OFFSET = "qm-dlq-offset"
CONSUMER = "qm-dlq-consumer"


def headers(record: Located, *, reason: str, consumer: str) -> list[tuple[str, bytes]]:
    """What a parked record carries besides itself: why, where from, who parked it."""
    return [
        (REASON, reason.encode()),
        (SOURCE_TOPIC, record.topic.encode()),
        (SOURCE_PARTITION, str(record.partition).encode()),
        (SOURCE_OFFSET, str(record.offset).encode()),
        (CONSUMER, consumer.encode()),
    ]


async def dead_letter(
    producer: EventProducer,
    topic: str,
    record: Record,
    *,
    reason: str,
    consumer: str,
) -> None:
    parked = headers(record, reason=reason, consumer=consumer)
    await producer.send_raw(topic, record.value, key=record.key, headers=parked)
    log.warning(
        "dead-lettered %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason
    )
