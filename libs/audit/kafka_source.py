"""The audit's Kafka edge: read the events and decisions topics into a :class:`Replay`.

Both topics are read to the ends they had when the audit began, committed
records only, as placement's consumers read them. Inputs stop at the offsets
placement's consumer group has committed: those are committed atomically with
their decisions, so every input below them has all its decisions on the log,
and inputs placement has not reached yet are not counted as missing decisions.

Placement's latest snapshot of each input partition is read too: a replay from the
start checks it when it reaches its offset; a replay ``from_snapshots`` loads it
(refusing one that does not load faithfully, ``libs.events.snapshot``) and replays
only what follows it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import NoError, TopicAuthorizationFailedError, for_code
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from google.protobuf.message import DecodeError as ProtoDecodeError
from qm.v1 import snapshot_pb2

from libs.audit.replay import AuditResult, Replay
from libs.bus import KafkaBus, KafkaSettings, TopicMissing, Topics
from libs.bus.compacted import CompactedTopic
from libs.core import PolicyConfig
from libs.events import DecodeError, decode
from libs.events.snapshot import key, restore
from libs.trust import Gate, load_trust

# Decisions recomputed (or recorded) ahead of the other side before that side's
# reading pauses: bounds memory when one topic arrives faster than the other.
WAITING_LIMIT = 20_000
MAX_RECORDS = 50_000
FETCH_BYTES = 16 << 20


class ProgressSink(Protocol):
    """Where a reading reports its progress: a rich ``Progress``, or a relay to one."""

    def add_task(self, description: str, *, total: float | None) -> Any: ...

    def update(self, task_id: Any, *, completed: float, total: float | None = None) -> None: ...


async def audit_topics(
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig | None = None,
    *,
    group: str | None = None,
    clusters: Collection[str] = (),
    progress: ProgressSink | None = None,
    from_snapshots: bool = False,
    partitions: Collection[int] | None = None,
    trust: Path | None = None,
) -> AuditResult:
    """Replay the events topic against the decisions topic; stop at the first divergence.

    ``group`` is placement's consumer group (its committed offsets bound the
    audit); ``clusters`` limits it to the input partitions holding those
    clusters (each partition is replayed whole: its scheduler folds them all).
    ``from_snapshots``: each partition from its latest snapshot, where it has one
    (``SnapshotError`` if one does not load). ``partitions``: only these input
    partitions (of those ``clusters`` leaves), each an independent stream. ``trust``:
    the trust file placement checks each input's signer with (``libs/trust``), so the
    replay refuses what it refused; without one, every input is folded.
    """
    gate = Gate(load_trust(trust)) if trust is not None else None
    bus = KafkaBus(settings)
    admin = bus.admin()
    consumer = bus.consumer(max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=4 * FETCH_BYTES)
    try:  # both closed whatever fails, their start too: no client is left open
        await admin.start()
        await consumer.start()
        inputs = await _partitions(admin, topics.events.name, clusters)
        if partitions is not None:
            inputs = [tp for tp in inputs if tp.partition in partitions]
        outputs = await _partitions(admin, topics.decisions.name, ())
        ends = await consumer.end_offsets(inputs)
        if group:
            ends = _bounds(ends, await admin.list_consumer_group_offsets(group, partitions=inputs))
        # After the bounds: every decision of an input below them is on the log by now.
        ends.update(await consumer.end_offsets(outputs))
        starts = await consumer.beginning_offsets([*inputs, *outputs])
        replay = Replay(config, bounds={tp.partition: ends[tp] for tp in inputs}, gate=gate)
        for tp, snapshot in (await _snapshots(bus, topics, inputs)).items():
            if snapshot.next_offset > ends[tp]:
                continue  # past what this audit reads (placement's group is behind it)
            if from_snapshots:
                schedulers = restore(snapshot, config or PolicyConfig(), gate)
                replay.start_from(tp.partition, snapshot.next_offset, schedulers)
                starts[tp] = max(starts[tp], snapshot.next_offset)
            else:
                replay.check_snapshot(tp.partition, snapshot.next_offset, snapshot.state_digests)
        reading = _Reading(consumer, replay, starts, ends, topics.events.name, progress)
        await reading.run(inputs, outputs)
        return replay.finish()
    finally:
        await consumer.stop()
        await admin.close()


async def _snapshots(
    bus: KafkaBus, topics: Topics, inputs: list[TopicPartition]
) -> dict[TopicPartition, snapshot_pb2.PlacementSnapshot]:
    """Placement's latest snapshot of each input partition that has one."""
    latest = await CompactedTopic(bus, topics.snapshots, client_id="audit-snapshots").latest()
    found = {}
    for tp in inputs:
        value = latest.get(key(tp.partition))
        if value is None:
            continue
        try:
            snapshot = snapshot_pb2.PlacementSnapshot.FromString(value)
        except ProtoDecodeError:
            continue  # placement passes it over too
        if snapshot.input_partition == tp.partition:
            found[tp] = snapshot
    return found


async def input_partitions(
    settings: KafkaSettings, topics: Topics, clusters: Collection[str] = ()
) -> list[int]:
    """The input partitions an audit of ``clusters`` (all when empty) replays."""
    admin = KafkaBus(settings).admin()
    try:
        await admin.start()
        return [tp.partition for tp in await _partitions(admin, topics.events.name, clusters)]
    finally:
        await admin.close()


async def _partitions(
    admin: AIOKafkaAdminClient, topic: str, clusters: Collection[str]
) -> list[TopicPartition]:
    [described] = await admin.describe_topics([topic])
    error = for_code(described["error_code"])
    if error is TopicAuthorizationFailedError:
        raise error(f"topic {topic}")
    if error is not NoError:
        raise TopicMissing(f"topic {topic} does not exist (is QM_TOPICS right?)")
    partitions = sorted(p["partition"] for p in described["partitions"])
    if clusters:
        # Where the producers' default partitioner puts each cluster's key.
        keyed = {DefaultPartitioner()(c.encode(), partitions, partitions) for c in clusters}
        partitions = sorted(keyed)
    return [TopicPartition(topic, p) for p in partitions]


def _bounds(
    ends: dict[TopicPartition, int], committed: dict[TopicPartition, OffsetAndMetadata]
) -> dict[TopicPartition, int]:
    """Per input partition, the offset below which placement has decided every record."""
    positions = {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}
    if not positions:
        # No such group (or it never committed): audit everything, so that a
        # wrong group name shows as missing decisions rather than a silent pass.
        return ends
    return {tp: min(end, positions.get(tp, 0)) for tp, end in ends.items()}


@dataclass
class _Reading:
    """One pass over both topics, pausing whichever side runs too far ahead."""

    consumer: AIOKafkaConsumer
    replay: Replay
    starts: dict[TopicPartition, int]
    ends: dict[TopicPartition, int]
    events_topic: str
    progress: ProgressSink | None

    async def run(self, inputs: list[TopicPartition], outputs: list[TopicPartition]) -> None:
        sides = {"events replayed": inputs, "decisions read": outputs}
        tasks = {
            name: self.progress.add_task(name, total=self._span(tps, self.ends))
            for name, tps in sides.items()
            if self.progress is not None
        }
        unread = {tp for tp in self.ends if self.ends[tp] > self.starts[tp]}
        self.consumer.assign(sorted(unread))
        for tp in unread:
            self.consumer.seek(tp, self.starts[tp])
        self._end_sides(unread)
        while unread and not self.replay.divergence:
            polled = await self.consumer.getmany(timeout_ms=500, max_records=MAX_RECORDS)
            for tp, records in polled.items():
                # Records past the ends arrived after the audit began: not audited.
                records = [r for r in records if r.offset < self.ends[tp]]
                if tp.topic == self.events_topic:
                    self._feed_inputs(tp.partition, [(r.offset, r.value) for r in records])
                else:
                    self._feed_recorded([r.value for r in records])
            positions = {tp: await self.consumer.position(tp) for tp in unread}
            if done := {tp for tp, at in positions.items() if at >= self.ends[tp]}:
                self.consumer.pause(*done)
                unread -= done
                self._end_sides(unread)
            if self.progress is not None:
                reached = {**self.ends, **positions}
                for name, tps in sides.items():
                    self.progress.update(tasks[name], completed=self._span(tps, reached))
            self._throttle(unread)

    def _span(self, tps: list[TopicPartition], at: dict[TopicPartition, int]) -> int:
        return sum(min(at[tp], self.ends[tp]) - self.starts[tp] for tp in tps)

    def _feed_inputs(self, partition: int, records: list[tuple[int, bytes | None]]) -> None:
        for offset, value in records:
            try:
                env = decode(value)
            except DecodeError:
                continue  # placement dead-letters it and decides nothing
            self.replay.feed_input(partition, offset, env, value or b"")

    def _feed_recorded(self, values: list[bytes | None]) -> None:
        for value in values:
            try:
                env = decode(value)
            except DecodeError:
                # Cannot be paired; the decision it should have been shows as missing.
                continue
            self.replay.feed_recorded(env)

    def _end_sides(self, unread: set[TopicPartition]) -> None:
        if not any(tp.topic == self.events_topic for tp in unread):
            self.replay.end_inputs()
        if all(tp.topic == self.events_topic for tp in unread):
            self.replay.end_recorded()

    def _throttle(self, unread: set[TopicPartition]) -> None:
        replay = self.replay
        ahead = {
            tp
            for tp in unread
            if (
                replay.expected_waiting(tp.partition) > WAITING_LIMIT
                if tp.topic == self.events_topic
                else replay.recorded_waiting > WAITING_LIMIT
            )
        }
        if ahead == unread:  # nothing else left to read: reading on is the only way forward
            ahead = set()
        self.consumer.pause(*ahead)
        self.consumer.resume(*(unread - ahead))
