"""A live tail of the events and decisions topics, for recovery times.

Records are timed by their Kafka CreateTime, stamped by the producing service on
this same host: "the first decision after the kill" is the first committed
decision record created after it, whenever the tail happens to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from libs.bus import KafkaBus, KafkaSettings, Topics
from libs.events import DecodeError, decode, event_type
from tests.chaos.invariants import Log, Record


@dataclass(frozen=True)
class Seen:
    at: float  # CreateTime, seconds since the epoch
    topic: str  # "events" or "decisions"
    kind: str  # the envelope's payload
    node_id: str
    job_id: str
    task_id: str = ""


def node_of(payload: object) -> str:
    """The node a payload is about, if it names one."""
    inventory = getattr(payload, "inventory", None)
    if inventory is not None:
        return str(inventory.node_id)
    return str(getattr(payload, "node_id", ""))


class Observer:
    def __init__(self, settings: KafkaSettings, topics: Topics) -> None:
        self._names = {topics.events.name: "events", topics.decisions.name: "decisions"}
        self._consumer = KafkaBus(settings).consumer(max_partition_fetch_bytes=4 << 20)
        self.seen: list[Seen] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.subscribe(list(self._names))
        self._task = asyncio.create_task(self._tail())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def _tail(self) -> None:
        while True:
            polled = await self._consumer.getmany(timeout_ms=500)
            for records in polled.values():
                for record in records:
                    with contextlib.suppress(DecodeError):
                        env = decode(record.value)
                        kind = event_type(env)
                        payload = getattr(env, kind)
                        self.seen.append(
                            Seen(
                                record.timestamp / 1000,
                                self._names[record.topic],
                                kind,
                                node_of(payload),
                                str(getattr(payload, "job_id", "")),
                                str(getattr(payload, "task_id", "")),
                            )
                        )
            if polled:
                self._changed.set()

    async def first_after(
        self, t0: float, wanted: Callable[[Seen], bool], timeout: float
    ) -> float | None:
        """The CreateTime of the first wanted record created after ``t0`` (None: timed out)."""
        deadline = time.monotonic() + timeout
        start = max(0, len(self.seen) - 5000)  # the tail may still be behind the kill
        while True:
            found = [s.at for s in self.seen[start:] if s.at > t0 and wanted(s)]
            if found:
                return min(found)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))


async def read_log(settings: KafkaSettings, topics: Topics, timeout: float = 120) -> Log:
    """Both topics from the start to their current ends, committed records only.

    Records that do not decode are left out: they decide nothing.
    """
    names = {topics.events.name: "events", topics.decisions.name: "decisions"}
    consumer = KafkaBus(settings).consumer(max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    log = Log()
    try:
        partitions = [
            TopicPartition(spec.name, p)
            for spec in (topics.events, topics.decisions)
            for p in range(spec.partitions)
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout
        unread = {tp for tp in partitions if ends[tp] > 0}
        while unread:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the log was not read in {timeout:g} s")
            polled = await consumer.getmany(*unread, timeout_ms=500, max_records=20_000)
            for tp, records in polled.items():
                into = log.events if names[tp.topic] == "events" else log.decisions
                for record in records:
                    if record.offset < ends[tp]:
                        with contextlib.suppress(DecodeError):
                            env = decode(record.value)
                            into.append(Record(tp.partition, record.offset, record.timestamp, env))
            unread = {tp for tp in unread if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    log.events.sort(key=lambda r: (r.partition, r.offset))
    log.decisions.sort(key=lambda r: (r.partition, r.offset))
    return log
