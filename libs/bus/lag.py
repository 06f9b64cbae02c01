"""How far a consumer is behind, and whether it still polls: ``qm_consumer_lag_records``
(measured after a poll, at most every ``every_s`` seconds: it asks the broker for the
end offsets) and ``qm_consumer_last_poll_timestamp_seconds`` (after every poll). A loop
stuck between polls stops both; the second says so."""

from __future__ import annotations

import time

from aiokafka.structs import TopicPartition

from libs.bus.ports import Consumer
from libs.telemetry.metrics import CONSUMER_LAG, CONSUMER_LAST_POLL, consumer_lag


class LagMeter:
    def __init__(self, consumer: Consumer, name: str, every_s: float = 5.0) -> None:
        self._consumer, self._name, self._every_s = consumer, name, every_s
        self._due = 0.0
        self._shown: set[TopicPartition] = set()

    async def polled(self) -> None:
        """The consumer has just polled: note when, and update its lag if due."""
        CONSUMER_LAST_POLL.labels(self._name).set_to_current_time()
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self._every_s
        assigned = sorted(self._consumer.assignment())
        # A partition another member took is its lag to show, not a stale one of ours.
        for tp in self._shown - set(assigned):
            CONSUMER_LAG.remove(self._name, tp.topic, str(tp.partition))
        self._shown = set(assigned)
        if not assigned:
            return
        # The end offsets of a read-committed consumer are the last stable ones.
        ends = await self._consumer.end_offsets(assigned)
        positions = {tp: await self._consumer.position(tp) for tp in assigned}
        for tp, behind in consumer_lag(ends, positions).items():
            CONSUMER_LAG.labels(self._name, tp.topic, str(tp.partition)).set(behind)
