"""Placement's consume-decide-produce loop over the in-memory bus: what it writes, what
it commits, what it dead-letters, and what it does across a restart and a rebalance."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY
from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery, EventConsumer, EventProducer, load_topic_config
from libs.bus.deadletter import CONSUMER, REASON, SOURCE_OFFSET, SOURCE_TOPIC
from libs.bus.memory import MemoryBus
from libs.bus.ports import Record
from libs.bus.producer import TYPE_HEADER
from libs.core import PolicyConfig
from libs.events import new_envelope
from libs.events.log_step import PartitionSchedulers, step
from libs.trust import Gate, load_trust
from services.placement.service import PlacementService
from services.placement.standby import Standby, Warm, absorb
from tests.placement_gate import GatedPlacement
from tests.signed_log import Signers

TOPICS = load_topic_config()
EVENTS, DECISIONS = TOPICS.events.name, TOPICS.decisions.name
GROUP = "qm-placement"
# Every input is keyed by its cluster: all of them land on this partition.
INPUT = TopicPartition(
    EVENTS, DefaultPartitioner()(b"default", *[list(range(TOPICS.events.partitions))] * 2)
)


def node() -> events_pb2.Envelope:
    inventory = types_pb2.NodeInventory(
        node_id="n0",
        gpus=[types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30) for i in range(8)],
    )
    return new_envelope(events_pb2.NodeRegistered(inventory=inventory), producer="test")


def job(i: int) -> events_pb2.Envelope:
    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"])
    return new_envelope(events_pb2.JobAdmitted(job_id=f"j-{i}", spec=spec), producer="test")


async def write(bus: MemoryBus, *envs: events_pb2.Envelope) -> None:
    async with EventProducer(bus, client_id="test") as producer:
        for env in envs:
            await producer.send(EVENTS, env)


def placed(bus: MemoryBus) -> Counter[str]:
    return Counter(
        env.task_placed.job_id for env in bus.envelopes(DECISIONS) if env.HasField("task_placed")
    )


def caught_up(bus: MemoryBus) -> Callable[[], bool]:
    """Placement has committed every input written so far."""
    return lambda: bus.committed(GROUP).get(INPUT) == len(bus.records(EVENTS))


def folded_afresh(bus: MemoryBus) -> bytes:
    """The digest of the default cluster's state folded from the whole input log, once."""
    fresh = PartitionSchedulers(PolicyConfig())
    for env in bus.envelopes(EVENTS):
        step(fresh.of(env.cluster), env)
    return fresh.of("default").digest()


def decisions_counted(kind: str) -> float:
    return REGISTRY.get_sample_value("qm_decisions_total", {"kind": kind}) or 0.0


def decision_delays() -> float:
    """Admissions whose decisions were committed (each observes one delay)."""
    labels = {"input": "job_admitted"}
    return REGISTRY.get_sample_value("qm_decision_delay_seconds_count", labels) or 0.0


@dataclass
class CountingPlacement(PlacementService):
    """Placement counting how often it folds each input offset."""

    folded: Counter[int] = field(default_factory=Counter)

    def outputs(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        self.folded[delivery.offset] += 1
        return super().outputs(delivery)


Service = TypeVar("Service", bound=PlacementService)


@asynccontextmanager
async def running(service: Service) -> AsyncIterator[Service]:
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_each_input_is_decided_and_committed_with_its_decisions() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), job(0), job(1))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)):
        await bus.until(caught_up(bus))
    assert placed(bus) == {"j-0": 1, "j-1": 1}
    records = bus.records(DECISIONS)
    assert {(r.key, r.partition) for r in records} == {(b"default", INPUT.partition)}
    # Typed in their headers; placement's knobs are announced before its first decision.
    assert [dict(r.headers)[TYPE_HEADER] for r in records] == [
        b"policy_configured",
        b"task_placed",
        b"task_placed",
    ]
    assert bus.committed(GROUP) == {INPUT: 3}  # partitions with nothing to commit: none


async def test_an_undecodable_record_is_dead_lettered_and_skipped() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node())
    await (await bus.producer().send(EVENTS, b"\xff not an envelope", b"default"))
    await write(bus, job(0))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)):
        await bus.until(caught_up(bus))
    assert placed(bus) == {"j-0": 1}
    [parked] = bus.records(TOPICS.deadletter.name)
    headers = dict(parked.headers)
    assert (parked.value, parked.key) == (b"\xff not an envelope", b"default")
    assert (headers[SOURCE_TOPIC], headers[SOURCE_OFFSET], headers[CONSUMER]) == (
        EVENTS.encode(),
        b"1",
        b"placement",
    )
    assert headers[REASON].startswith(b"not a qm.v1.Envelope")


async def test_a_record_its_signer_may_not_write_is_refused_parked_and_never_folded(
    tmp_path: Path,
) -> None:
    signers = Signers(tmp_path)
    gate = Gate(load_trust(signers.trust_file))
    admission, n0 = signers.service("admission"), signers.node("n0")
    approval = events_pb2.NodeApproved(node_id="n0", public_key=n0.public)
    registered = node()
    registered.node_registered.public_key = n0.public
    forged = job(1)  # a node's key on admission's event
    bus = MemoryBus.for_topics(TOPICS)
    async with EventProducer(bus, client_id="admission", sealer=admission) as producer:
        await producer.send(EVENTS, new_envelope(approval, producer="test"))
    async with EventProducer(bus, client_id="node", sealer=n0) as producer:
        await producer.send(EVENTS, registered)
        await producer.send(EVENTS, forged)
    await write(bus, job(2))  # unsigned
    async with EventProducer(bus, client_id="admission", sealer=admission) as producer:
        await producer.send(EVENTS, job(0))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP, gate=gate)):
        await bus.until(caught_up(bus))
    assert placed(bus) == {"j-0": 1}
    refused = [
        (env.input_refused.event_id, env.input_refused.trust)
        for env in bus.envelopes(DECISIONS)
        if env.input_refused.trust
    ]
    unsigned = bus.envelopes(EVENTS)[3]
    assert refused == [(forged.event_id, "out_of_role"), (unsigned.event_id, "unsigned")]
    parked = bus.records(TOPICS.deadletter.name)
    assert [dict(r.headers)[REASON].split(b":")[0] for r in parked] == [
        b"untrusted (out_of_role)",
        b"untrusted (unsigned)",
    ]
    assert [r.value for r in parked] == [bus.records(EVENTS)[i].value for i in (2, 3)]
    # A standby behind the same gate folds the same state.
    warm = Warm(PartitionSchedulers(PolicyConfig(), gate=gate), 0)
    absorb(warm, bus.records(EVENTS), len(bus.records(EVENTS)))
    recorded = [e for e in bus.envelopes(DECISIONS) if e.HasField("task_placed")][-1]
    assert warm.schedulers.of("default").digest() == recorded.task_placed.provenance.state_digest


async def test_a_restarted_placement_rebuilds_its_state_and_decides_only_new_input() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), job(0), job(1))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)):
        await bus.until(caught_up(bus))
    await write(bus, job(2))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)):
        await bus.until(caught_up(bus))
    # j-2 is placed on the node registered before the restart: the log rebuilt that.
    assert placed(bus) == {"j-0": 1, "j-1": 1, "j-2": 1}


async def test_a_batch_decided_across_a_rebalance_is_aborted_and_decided_again_once() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), *(job(i) for i in range(6)))
    counted, delays = decisions_counted("task_placed"), decision_delays()
    async with running(GatedPlacement(bus, TOPICS, group_id=GROUP, pause_at="j-3")) as service:
        await asyncio.wait_for(service.paused.wait(), 5)
        intruder = bus.consumer(group_id=GROUP)
        await intruder.start()
        intruder.subscribe([EVENTS])  # joins the group: placement's partitions move
        await intruder.getmany(timeout_ms=0)
        service.go_on.set()
        await asyncio.sleep(0.05)
        assert placed(bus) == {}  # the batch's transaction was aborted
        await intruder.stop()  # the partitions come back; decided again from offset 0
        await bus.until(caught_up(bus))
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}
    # Counted once committed: the aborted batch's decisions are not.
    assert decisions_counted("task_placed") - counted == 6
    assert decision_delays() - delays == 6


async def test_a_batch_cut_short_by_an_assignment_alone_is_decided_again() -> None:
    # aiokafka revokes, lets a poll run, then assigns: a partition taken over by that poll
    # hears of the new generation only from the assignment, with no revocation after it.
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), *(job(i) for i in range(6)))
    async with running(GatedPlacement(bus, TOPICS, group_id=GROUP, pause_at="j-3")) as service:
        await asyncio.wait_for(service.paused.wait(), 5)
        service.assigned({INPUT.partition})
        service.go_on.set()
        await asyncio.sleep(0.05)
        await bus.until(caught_up(bus))
    # Not one record skipped: the cut batch's records were decided again, once.
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}


async def test_a_state_revoked_while_a_record_is_folded_is_not_kept_as_clean() -> None:
    # The group revokes while j-3's decisions are queued: its scheduler has folded j-3,
    # whose transaction aborts. Kept as the state at the committed offset, it would fold
    # j-3 twice when the partition comes back (and a second admission places nothing).
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), *(job(i) for i in range(3)))
    gated = GatedPlacement(bus, TOPICS, group_id=GROUP, pause_at="j-3", after_fold=True)
    async with running(gated) as service:
        await bus.until(caught_up(bus))
        await write(bus, *(job(i) for i in range(3, 6)))  # j-3 first in its batch
        await asyncio.wait_for(service.paused.wait(), 5)
        # The group takes every partition and gives them straight back (one instance,
        # its coordinator restarted), as the consumer's callbacks tell the service.
        everything = set(range(TOPICS.events.partitions))
        service.revoked(everything)
        service.assigned(everything)
        service.go_on.set()
        await bus.until(caught_up(bus))
        kept = service.owned[INPUT.partition].schedulers.of("default").digest()
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}
    assert kept == folded_afresh(bus)


async def test_a_partition_straight_back_is_fenced_before_its_offset_is_read() -> None:
    # The broker answers a commit before the group's offsets take it in: read at once, the
    # committed offset is the one before it. Kept by the instance that committed it, the
    # partition comes straight back in a rebalance: fenced anew (which waits for the last
    # transaction to complete) before its offset is read, nothing is decided twice.
    bus = MemoryBus.for_topics(TOPICS, lagging_offsets=True)
    await write(bus, node(), *(job(i) for i in range(3)))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)) as service:
        await bus.until(lambda: sum(placed(bus).values()) == 3)
        everything = set(range(TOPICS.events.partitions))
        service.revoked(everything)
        service.assigned(everything)
        await write(bus, *(job(i) for i in range(3, 6)))
        await bus.until(lambda: sum(placed(bus).values()) >= 6)
        await asyncio.sleep(0.05)  # time for a decision made twice to land
    bus.complete_transactions()
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}
    assert bus.committed(GROUP)[INPUT] == len(bus.records(EVENTS))


async def test_a_kept_state_survives_a_failed_fence_and_is_not_folded_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The partition comes straight back, and its new producer fails to start (the
    # broker does not answer). The state kept for it is still the committed offset's:
    # the standby keeps it, so the next takeover resumes from it rather than folding
    # the partition's log from the start.
    cold: list[int] = []
    original = Standby._cold

    async def counted(self: Standby, partition: int, upto: int) -> Warm:
        cold.append(partition)
        return await original(self, partition, upto)

    monkeypatch.setattr(Standby, "_cold", counted)
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), *(job(i) for i in range(3)))
    async with running(PlacementService(bus, TOPICS, group_id=GROUP)) as service:
        await bus.until(lambda: sum(placed(bus).values()) == 3)
        started_cold = list(cold)  # every partition's first takeover
        everything = set(range(TOPICS.events.partitions))
        service.revoked(everything)
        bus.failed_starts = 1
        service.assigned(everything)
        await write(bus, *(job(i) for i in range(3, 6)))
        await bus.until(lambda: sum(placed(bus).values()) >= 6)
        await bus.until(lambda: len(service.owned) == len(everything))  # taken again
        await asyncio.sleep(0.05)  # time for a decision made twice to land
    assert bus.failed_starts == 0  # one takeover did fail
    assert cold == started_cold
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}


async def test_a_batch_polled_before_a_rebalance_is_read_again_not_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The consumer polls j-3..j-5, then waits before handing them over (as its lag meter
    # does on a broker that restarts); the group rebalances meanwhile and sets every
    # position back to the committed offset. Decided, that batch would be folded here
    # and again when read anew.
    original = EventConsumer.decode
    handed, go_on = asyncio.Event(), asyncio.Event()

    async def slow(self: EventConsumer, record: Record) -> Delivery | None:
        delivery = await original(self, record)
        if delivery is not None and delivery.envelope.job_admitted.job_id == "j-3":
            handed.set()
            await go_on.wait()
        return delivery

    monkeypatch.setattr(EventConsumer, "decode", slow)
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), *(job(i) for i in range(3)))
    async with running(CountingPlacement(bus, TOPICS, group_id=GROUP)) as service:
        await bus.until(caught_up(bus))
        await write(bus, *(job(i) for i in range(3, 6)))
        await asyncio.wait_for(handed.wait(), 5)
        await bus._rebalance(GROUP)
        go_on.set()
        await bus.until(caught_up(bus))
        await asyncio.sleep(0.05)
        kept = service.owned[INPUT.partition].schedulers.of("default").digest()
    assert service.folded == dict.fromkeys(range(7), 1)
    assert placed(bus) == {f"j-{i}": 1 for i in range(6)}
    assert kept == folded_afresh(bus)


async def test_a_record_delivered_again_is_not_folded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A consumer may hand over again what it fetched before a rebalance.
    original = EventConsumer.batches

    async def twice(self: EventConsumer, timeout_ms: int = 500) -> AsyncIterator[list[Delivery]]:
        async for batch in original(self, timeout_ms):
            yield batch
            if batch:
                yield batch

    monkeypatch.setattr(EventConsumer, "batches", twice)
    bus = MemoryBus.for_topics(TOPICS)
    await write(bus, node(), job(0), job(1))
    async with running(CountingPlacement(bus, TOPICS, group_id=GROUP)) as service:
        await bus.until(caught_up(bus))
        await asyncio.sleep(0.05)
    assert service.folded == {0: 1, 1: 1, 2: 1}
    assert placed(bus) == {"j-0": 1, "j-1": 1}
