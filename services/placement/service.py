"""The placement loop: consume the event log, decide, emit, all in one transaction.

Each input partition (a cluster's events, or several clusters') is decided by one
instance of the consumer group at a time. Its decisions and the consumer offset that
produced them are committed in one Kafka transaction of a producer of that partition
alone (transactional id ``<group>-p<partition>``), so a crash never loses or doubles
a decision, and an instance that is handed a partition fences whoever decided it
before (itself too, when the partition comes straight back): starting the partition's
producer aborts the old owner's open transaction, waits for its committing one to
complete, and refuses it any later commit. Only then is the group's committed offset
read, so the new owner resumes exactly where the last commit left off, even from a
zombie that had not yet noticed it lost the partition.

Every instance is also a standby (``services/placement/standby.py``): it keeps the
partitions it does not own folded up to their committed offsets, so a takeover
decides within moments instead of folding the log. Its state of a partition is a
pure function of the log before that offset; a snapshot (``snapshots.py``), which
the owner writes every ``snapshot_every`` inputs, lets a cold instance skip most of
the fold.

The loop stays in its consumer group: it yields to the event loop between
records, so the consumer's heartbeats go out however long a batch takes (the
core bounds the cost of any one record). If the group rebalances anyway while a
batch is decided, the batch's transactions are aborted rather than committed:
aiokafka commits offsets in a transaction without the group's generation
(KIP-447), so only the fencing above, and this, keep a member that no longer owns
a partition from committing it. Aborted, the records are decided once more from
the committed offsets, by whoever owns them now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from qm.v1 import events_pb2

from libs.bus import Bus, Delivery, EventConsumer, EventProducer, Topics
from libs.bus.deadletter import dead_letter
from libs.core import PolicyConfig
from libs.events import event_type, release
from libs.events.log_step import PartitionSchedulers
from libs.events.snapshot import take
from libs.telemetry.metrics import (
    DECISION_DELAY_SECONDS,
    DECISION_SECONDS,
    DECISIONS,
    PLACEMENT_PARTITIONS,
    SNAPSHOTS,
)
from libs.trust import Gate
from libs.trust.gate import parked_reason
from services.placement.snapshots import SnapshotStore
from services.placement.standby import Standby, Warm

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

# A dead owner is noticed when its session lapses; the rest of a takeover is a fold of
# what the standby has not yet seen and a producer's start: together well within 5 s.
SESSION_TIMEOUT_MS = 3_000
HEARTBEAT_INTERVAL_MS = 500


@dataclass
class Owned:
    """A partition this instance decides: its schedulers and its fencing producer."""

    schedulers: PartitionSchedulers
    producer: EventProducer
    offset: int  # the next input record the schedulers have not folded
    committed: int  # the group's offset after this instance's last commit
    snapshot_offset: int  # where the latest snapshot of it was taken

    @property
    def clean(self) -> bool:
        """Its state is exactly that at the committed offset (nothing decided since)."""
        return self.offset == self.committed


@dataclass
class PlacementService:
    bus: Bus
    topics: Topics
    # The consumer group, and the prefix of each partition's transactional id.
    group_id: str = "qm-placement"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # Names this instance to the bus (client ids), e.g. its pod's name.
    instance: str = "placement"
    # Inputs decided between two snapshots of a partition.
    snapshot_every: int = 50_000
    # Checks each input's signer before it is folded (``libs/trust/gate.py``); None
    # folds every input as it comes (tests of the loop alone).
    gate: Gate | None = None
    owned: dict[int, Owned] = field(default_factory=dict)
    # Bumped by every rebalance: a batch decided across one is not committed.
    generation: int = 0
    # Set once the group has assigned this instance its partitions (maybe none: a standby).
    ready: bool = False
    # Given up in a rebalance with a clean state, kept in case they come straight back
    # (the state: the partition is fenced anew all the same, ``_take_over``).
    _released: dict[int, Owned] = field(default_factory=dict)
    _retiring: list[EventProducer] = field(default_factory=list)
    _standby: Standby | None = None
    _snapshots: SnapshotStore | None = None
    _deadletters: EventProducer = field(init=False)

    async def run(self) -> None:
        deadletters = self._deadletters = EventProducer(self.bus, client_id=f"{self.instance}-dlq")
        consumer = EventConsumer(
            self.bus,
            [self.topics.events.name],
            name="placement",
            client_id=self.instance,
            group_id=self.group_id,
            deadletter_topic=self.topics.deadletter.name,
            deadletter_producer=deadletters,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        self._snapshots = SnapshotStore(
            self.bus, self.topics.snapshots, client_id=f"{self.instance}-snapshots"
        )
        self._standby = Standby(
            self.bus,
            self.topics.events,
            group_id=self.group_id,
            policy=self.policy,
            store=self._snapshots,
            gate=self.gate,
            client_id=f"{self.instance}-standby",
        )
        standby = asyncio.create_task(self._standby.run(), name="placement-standby")
        await deadletters.start()
        await consumer.start(listener=_Rebalance(self))
        try:
            async for batch in consumer.batches():
                if standby.done():
                    standby.result()  # the standby's failure is the service's
                if consumer.client.assignment():
                    try:
                        await self._decide_batch(consumer, batch)
                    except Rebalanced:
                        log.warning(
                            "the group rebalanced while %d records were decided: their "
                            "transactions are aborted; they are decided again from the "
                            "committed offsets",
                            len(batch),
                        )
                await self._retire()
        finally:
            standby.cancel()
            await asyncio.gather(standby, return_exceptions=True)
            await consumer.stop()
            for owned in [*self.owned.values(), *self._released.values()]:
                self._retiring.append(owned.producer)
            await self._retire()
            await deadletters.stop()
            await self._snapshots.stop()

    async def _decide_batch(self, consumer: EventConsumer, batch: list[Delivery]) -> None:
        client = consumer.client
        generation = self.generation
        records: dict[int, list[Delivery]] = {}
        for delivery in batch:
            records.setdefault(delivery.partition, []).append(delivery)
        for tp in sorted(client.assignment()):
            self._still_owner(generation)
            mine = records.get(tp.partition, [])
            # The positions cover dead-lettered records too, so those are not re-read.
            position = await client.position(tp)
            try:
                owned = self.owned.get(tp.partition)
                if owned is None:
                    resume = mine[0].offset if mine else position
                    owned = await self._take_over(consumer, tp, resume, generation)
                    if owned is None:
                        continue  # it resumes elsewhere: these records are read again
                if not mine and position == owned.committed:
                    continue  # an idle poll costs no broker round trip
                await self._commit(owned, tp, mine, position, generation)
            except Rebalanced:
                raise
            except Exception:
                # Fenced (another instance took the partition), or the broker failed the
                # takeover or the transaction: any state folded past the committed offset
                # is dropped, and the next poll takes the partition over afresh from it.
                log.exception("partition %d: its takeover or transaction failed", tp.partition)
                self._drop(tp.partition)

    async def _commit(
        self,
        owned: Owned,
        tp: TopicPartition,
        records: list[Delivery],
        position: int,
        generation: int,
    ) -> None:
        producer = owned.producer
        decided: list[tuple[events_pb2.Envelope, list[events_pb2.Envelope]]] = []
        async with producer.client.transaction():  # an exception aborts it
            acks = []
            for delivery in records:
                self._still_owner(generation)
                if delivery.offset < owned.offset:
                    # Folded already: a consumer may hand over again what it had fetched
                    # before a rebalance, and a second fold would change the state.
                    log.warning(
                        "partition %d: record %d again, skipped", tp.partition, delivery.offset
                    )
                    continue
                # Past the committed offset (no longer ``clean``) before the record is
                # folded: a rebalance while its decisions are queued must not keep this
                # state as the one at the committed offset.
                owned.offset = delivery.offset + 1
                outputs, queued = await self._decide(producer, delivery)
                acks.extend(queued)
                decided.append((delivery.envelope, outputs))
                await asyncio.sleep(0)  # the consumer's heartbeat runs between records
            await asyncio.gather(*acks)
            self._still_owner(generation)
            await producer.client.send_offsets_to_transaction({tp: position}, self.group_id)
            self._still_owner(generation)
        owned.offset = owned.committed = position
        _count(decided, time.time())
        if owned.committed - owned.snapshot_offset >= self.snapshot_every:
            await self._snapshot(tp.partition, owned)

    async def _take_over(
        self, consumer: EventConsumer, tp: TopicPartition, resume: int, generation: int
    ) -> Owned | None:
        """Own ``tp``: fence its last owner, then resume from the committed offset
        (None when that is not ``resume``, where this poll's records start: the
        consumer is moved there, and the next poll reads from it).

        A partition that comes straight back is fenced too, though its last owner is this
        instance: the broker answers a transaction's commit before the group's offsets
        take it in, and an offset fetch does not wait for them (aiokafka asks without
        KIP-447's ``require_stable``), so right after a commit it can read the offset
        from before it, and the records in between would be decided twice. Starting a
        producer waits until the last transaction of its id is complete, offsets too.
        Should the broker fail either step, the state kept goes to the standby, for the
        next takeover to resume from."""
        assert self._standby is not None
        owned = self._released.pop(tp.partition, None)
        if owned is not None:
            self._retiring.append(owned.producer)  # fenced by its successor below
        producer = EventProducer(
            self.bus,
            client_id=f"{self.instance}-p{tp.partition}",
            transactional_id=f"{self.group_id}-p{tp.partition}",
        )
        self._retiring.append(producer)  # until it is this partition's
        try:
            await producer.start()  # fences the last owner: it can commit nothing more
            committed = await consumer.client.committed(tp) or 0
        except BaseException:
            if owned is not None:  # still the committed offset's: the next takeover's
                self._standby.give(tp.partition, Warm(owned.schedulers, owned.offset))
            raise
        self._retiring.remove(producer)
        try:
            return await self._resume(consumer, tp, resume, committed, generation, owned, producer)
        except BaseException:
            if tp.partition not in self.owned:
                self._retiring.append(producer)
            raise

    async def _resume(
        self,
        consumer: EventConsumer,
        tp: TopicPartition,
        resume: int,
        committed: int,
        generation: int,
        owned: Owned | None,
        producer: EventProducer,
    ) -> Owned | None:
        assert self._standby is not None
        if owned is None or owned.committed != committed:
            if owned is not None:  # another instance decided it meanwhile: start over
                self._standby.give(tp.partition, Warm(owned.schedulers, owned.offset))
            warm = await self.warm(tp.partition, committed)
            owned = Owned(
                warm.schedulers.announcing(release.current()),
                producer,
                offset=committed,
                committed=committed,
                snapshot_offset=warm.snapshot_offset,
            )
        else:
            owned.producer = producer  # the state is the committed offset's: kept
        if self.generation != generation:  # the group moved partitions meanwhile
            self._standby.give(tp.partition, Warm(owned.schedulers, owned.offset))
            raise Rebalanced  # its producer retires with the raise (``_take_over``)
        if committed != resume:
            consumer.client.seek(tp, committed)
        log.info(
            "partition %d: deciding from offset %d as release %s",
            tp.partition,
            committed,
            release.current(),
        )
        self.owned[tp.partition] = owned
        self._count_partitions()
        return owned if committed == resume else None

    async def warm(self, partition: int, upto: int) -> Warm:
        """The partition's state having folded its records before ``upto``."""
        assert self._standby is not None
        return await self._standby.take(partition, upto)

    async def _snapshot(self, partition: int, owned: Owned) -> None:
        assert self._snapshots is not None
        snapshot = take(
            owned.schedulers,
            partition=partition,
            next_offset=owned.committed,
            taken_at=datetime.now(UTC),
        )
        owned.snapshot_offset = owned.committed
        try:
            await self._snapshots.save(snapshot)
        except Exception:  # a snapshot only saves time: deciding goes on without it
            log.exception("partition %d: the snapshot was not written", partition)
            return
        SNAPSHOTS.labels(str(partition)).inc()
        log.info(
            "partition %d: snapshot at offset %d (%d bytes)",
            partition,
            owned.committed,
            len(snapshot.state),
        )

    def _still_owner(self, generation: int) -> None:
        if self.generation != generation:
            raise Rebalanced

    async def _decide(
        self, producer: EventProducer, delivery: Delivery
    ) -> tuple[list[events_pb2.Envelope], list[Any]]:
        """Decide one record under its consumer span, and queue its outputs inside: each
        decision's produce span is a child of the record's, in the trace that sent it.
        Returns the outputs and their acknowledgements."""
        env = delivery.envelope
        with tracer.start_as_current_span(
            f"placement {event_type(env)}",
            context=delivery.context,
            attributes={
                "qm.event_id": env.event_id,
                "qm.partition": delivery.partition,
                "qm.offset": delivery.offset,
            },
        ):
            started = time.perf_counter()
            outputs = self.outputs(delivery)
            DECISION_SECONDS.labels(event_type(env)).observe(time.perf_counter() - started)
            refused = outputs[-1].input_refused if outputs else None
            if refused is not None and refused.trust and delivery.record is not None:
                # Refused for its signer: parked with the reason, as an undecodable one is.
                await dead_letter(
                    self._deadletters,
                    self.topics.deadletter.name,
                    delivery.record,
                    reason=parked_reason(refused.trust, refused.reason),
                    consumer="placement",
                )
            return outputs, await self._enqueue(producer, outputs)

    async def _enqueue(
        self, producer: EventProducer, outputs: list[events_pb2.Envelope]
    ) -> list[Any]:
        """Queue one record's decisions in the open transaction; their acknowledgements."""
        acks = []
        for out in outputs:
            # The decisions topic is their record; a line each would cost what deciding does.
            log.debug("%s %s", event_type(out), out.correlation_id)
            acks.append(await producer.enqueue(self.topics.decisions.name, out, key=out.cluster))
        return acks

    def outputs(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        """The decisions one input record causes."""
        owned = self.owned.get(delivery.partition)
        if owned is None:  # revoked since the batch began
            raise Rebalanced
        return owned.schedulers.decide(
            delivery.envelope,
            partition=delivery.partition,
            offset=delivery.offset,
            record=delivery.value,
        )

    def revoked(self, partitions: set[int]) -> None:
        """The group took ``partitions`` (all, in a rebalance): keep the clean states."""
        self.generation += 1
        for partition in partitions:
            self._give_up(partition)
        self._count_partitions()

    def assigned(self, partitions: set[int]) -> None:
        """The group gave this instance ``partitions``: the others it keeps warm, and
        those it decided until now and lost go back to its standby."""
        assert self._standby is not None
        self.generation += 1
        self.ready = True
        log.info("assigned input partitions %s", sorted(partitions))
        # A poll may run between the group's revoking and assigning callbacks, and take
        # over partitions (maybe deciding records it may not commit: it was cut short by
        # this callback). Each is taken over again in this generation, from the
        # committed offset, like any other partition assigned now.
        for partition in list(self.owned):
            self._give_up(partition)
        for partition in set(self._released) - partitions:
            owned = self._released.pop(partition)
            self._standby.give(partition, Warm(owned.schedulers, owned.offset))
            self._retiring.append(owned.producer)
        self._standby.follow(set(range(self.topics.events.partitions)) - partitions)
        self._count_partitions()

    def _give_up(self, partition: int) -> None:
        """Stop deciding ``partition``; a clean state is kept in case it comes straight
        back (its records past the committed offset are then read again)."""
        owned = self.owned.pop(partition, None)
        if owned is None:
            return
        log.info("partition %d: given up", partition)
        if owned.clean:
            self._released[partition] = owned
        else:
            self._retiring.append(owned.producer)

    def _drop(self, partition: int) -> None:
        owned = self.owned.pop(partition, None)
        if owned is not None:
            self._retiring.append(owned.producer)
        self._count_partitions()

    async def _retire(self) -> None:
        while self._retiring:
            producer = self._retiring.pop()
            try:
                await producer.stop()
            except Exception:  # fenced or the broker gone: it is dropped either way
                log.warning("a partition producer did not stop cleanly", exc_info=True)

    def _count_partitions(self) -> None:
        PLACEMENT_PARTITIONS.labels("active").set(len(self.owned))
        standby = self.topics.events.partitions - len(self.owned)
        PLACEMENT_PARTITIONS.labels("standby").set(standby)


def _count(
    decided: list[tuple[events_pb2.Envelope, list[events_pb2.Envelope]]], now: float
) -> None:
    """Count committed decisions by kind, and how long after its input each was made."""
    for env, outputs in decided:
        for out in outputs:
            DECISIONS.labels(event_type(out)).inc()
        if outputs:
            delay = max(0.0, now - env.occurred_at.ToMicroseconds() / 1e6)
            DECISION_DELAY_SECONDS.labels(event_type(env)).observe(delay)


class Rebalanced(Exception):
    """The group rebalanced while a batch was decided: its transactions must abort."""


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Tell the service which partitions it holds now."""

    def __init__(self, service: PlacementService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._service.revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # A partition's state is taken over lazily, at the loop's next poll.
        self._service.assigned({tp.partition for tp in assigned})
