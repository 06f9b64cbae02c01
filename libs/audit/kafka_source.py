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

import asyncio
import multiprocessing
from collections.abc import Collection
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from google.protobuf.message import DecodeError as ProtoDecodeError
from qm.v1 import snapshot_pb2
from rich.progress import Progress, TaskID

from libs.audit.replay import AuditResult, Replay
from libs.bus import KafkaBus, KafkaSettings, Topics
from libs.bus.compacted import CompactedTopic
from libs.core import PolicyConfig
from libs.events import DecodeError, decode
from libs.events.snapshot import key, restore

# Decisions recomputed (or recorded) ahead of the other side before that side's
# reading pauses: bounds memory when one topic arrives faster than the other.
WAITING_LIMIT = 20_000
MAX_RECORDS = 50_000
FETCH_BYTES = 16 << 20


async def audit_topics(
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig | None = None,
    *,
    group: str | None = None,
    clusters: Collection[str] = (),
    progress: Progress | None = None,
    from_snapshots: bool = False,
    workers: int = 1,
) -> AuditResult:
    """Replay the events topic against the decisions topic; stop at the first divergence.

    ``group`` is placement's consumer group (its committed offsets bound the
    audit); ``clusters`` limits it to the input partitions holding those
    clusters (each partition is replayed whole: its scheduler folds them all).
    ``from_snapshots``: each partition from its latest snapshot, where it has one
    (``SnapshotError`` if one does not load). ``workers``: processes replaying input
    partitions side by side (each its share of them, every one reading the decisions),
    when the log is long enough to be worth their start.
    """
    config = config or PolicyConfig()
    bus = KafkaBus(settings)
    cut = await _cut(bus, topics, group, clusters)
    inputs = [tp for tp in cut.inputs if cut.ends[tp] > cut.starts[tp]]
    work = sum(cut.ends[tp] - cut.starts[tp] for tp in inputs)
    shares = [inputs[i::workers] for i in range(min(workers, len(inputs)))]
    if len(shares) < 2 or work < PARALLEL_FROM:
        return await _replay(bus, topics, config, cut, cut.inputs, progress, from_snapshots)
    return await _in_parallel(settings, topics, config, cut, shares, progress, from_snapshots)


@dataclass(frozen=True)
class _Cut:
    """What an audit reads: the partitions, and where each starts and ends."""

    inputs: list[TopicPartition]
    outputs: list[TopicPartition]
    starts: dict[TopicPartition, int]
    ends: dict[TopicPartition, int]


async def _cut(bus: KafkaBus, topics: Topics, group: str | None, clusters: Collection[str]) -> _Cut:
    admin = bus.admin()
    consumer = bus.consumer()
    await admin.start()
    try:
        await consumer.start()
        inputs = await _partitions(admin, topics.events.name, clusters)
        outputs = await _partitions(admin, topics.decisions.name, ())
        ends = await consumer.end_offsets(inputs)
        if group:
            ends = _bounds(ends, await admin.list_consumer_group_offsets(group, partitions=inputs))
        # After the bounds: every decision of an input below them is on the log by now.
        ends.update(await consumer.end_offsets(outputs))
        starts = await consumer.beginning_offsets([*inputs, *outputs])
        return _Cut(inputs, outputs, starts, ends)
    finally:
        await consumer.stop()
        await admin.close()


async def _replay(
    bus: KafkaBus,
    topics: Topics,
    config: PolicyConfig,
    cut: _Cut,
    inputs: list[TopicPartition],
    progress: Progress | _Shared | None,
    from_snapshots: bool,
) -> AuditResult:
    """Replay ``inputs`` (some of the cut's input partitions) against every decision."""
    starts = dict(cut.starts)
    replay = Replay(config, bounds={tp.partition: cut.ends[tp] for tp in inputs})
    for tp, snapshot in (await _snapshots(bus, topics, inputs)).items():
        if snapshot.next_offset > cut.ends[tp]:
            continue  # past what this audit reads (placement's group is behind it)
        if from_snapshots:
            schedulers = restore(snapshot, config)
            replay.start_from(tp.partition, snapshot.next_offset, schedulers)
            starts[tp] = max(starts[tp], snapshot.next_offset)
        else:
            replay.check_snapshot(tp.partition, snapshot.next_offset, snapshot.state_digests)
    consumer = bus.consumer(max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=4 * FETCH_BYTES)
    await consumer.start()
    try:
        ends = {tp: cut.ends[tp] for tp in [*inputs, *cut.outputs]}
        reading = _Reading(consumer, replay, starts, ends, topics.events.name, progress)
        await reading.run(inputs, cut.outputs)
        return replay.finish()
    finally:
        await consumer.stop()


async def _in_parallel(
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig,
    cut: _Cut,
    shares: list[list[TopicPartition]],
    progress: Progress | None,
    from_snapshots: bool,
) -> AuditResult:
    """Each share of the input partitions replayed in a process of its own; the
    verdicts merged. Progress comes back through counters the workers share."""
    context = multiprocessing.get_context("spawn")  # no fork of a running event loop
    counters = context.Array("q", 4 * len(shares), lock=False)  # per worker: 2 × (done, total)
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(
        len(shares), mp_context=context, initializer=_share, initargs=(counters,)
    ) as pool:
        running = [
            loop.run_in_executor(
                pool, _replay_share, index, settings, topics, config, cut, share, from_snapshots
            )
            for index, share in enumerate(shares)
        ]
        tasks = {}
        if progress is not None:
            tasks = {side: progress.add_task(name, total=None) for side, name in enumerate(SIDES)}
        while not all(future.done() for future in running):
            await asyncio.wait(running, timeout=0.2)
            for side, task in tasks.items():
                done = sum(counters[4 * w + 2 * side] for w in range(len(shares)))
                total = sum(counters[4 * w + 2 * side + 1] for w in range(len(shares)))
                progress.update(task, completed=done, total=total or None)  # type: ignore[union-attr]
        return merged([future.result() for future in running])


def merged(results: list[AuditResult]) -> AuditResult:
    """Verdicts of disjoint sets of input partitions as one: the first divergence by
    position, the first knobs that differ."""
    found = [r.divergence for r in results if r.divergence is not None]
    first = min(found, key=lambda d: (d.partition, d.input_offset, d.index), default=None)
    return AuditResult(
        inputs=sum(r.inputs for r in results),
        checked=sum(r.checked for r in results),
        reproduced=sum(r.reproduced for r in results),
        divergence=first,
        config=next((r.config for r in results if r.config), ()),
        snapshots=tuple(
            sorted((s for r in results for s in r.snapshots), key=lambda s: s.partition)
        ),
        started_from=tuple(sorted(p for r in results for p in r.started_from)),
    )


SIDES = ("events", "decisions")
# Below this many input records, a worker's start (imports, connections) costs more
# than it saves.
PARALLEL_FROM = 20_000
_counters: Any = None  # the worker's view of the progress counters


def _share(counters: Any) -> None:
    global _counters
    _counters = counters


class _Shared:
    """The bit of rich's ``Progress`` a replay uses, writing to the shared counters."""

    def __init__(self, worker: int) -> None:
        self._base = 4 * worker

    def add_task(self, name: str, total: int) -> TaskID:
        slot = self._base + 2 * SIDES.index(name)
        _counters[slot + 1] = total
        return TaskID(slot)

    def update(self, slot: TaskID, completed: int) -> None:
        _counters[slot] = completed


def _replay_share(
    worker: int,
    settings: KafkaSettings,
    topics: Topics,
    config: PolicyConfig,
    cut: _Cut,
    share: list[TopicPartition],
    from_snapshots: bool,
) -> AuditResult:
    bus = KafkaBus(settings)
    return asyncio.run(_replay(bus, topics, config, cut, share, _Shared(worker), from_snapshots))


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


async def _partitions(
    admin: AIOKafkaAdminClient, topic: str, clusters: Collection[str]
) -> list[TopicPartition]:
    [described] = await admin.describe_topics([topic])
    if described["error_code"]:
        raise RuntimeError(f"topic {topic} does not exist (is QM_TOPICS right?)")
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
    progress: Progress | _Shared | None

    async def run(self, inputs: list[TopicPartition], outputs: list[TopicPartition]) -> None:
        sides = {"events": inputs, "decisions": outputs}
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
            self.replay.feed_input(partition, offset, env)

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
