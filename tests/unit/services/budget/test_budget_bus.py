"""A budget change over the in-memory bus: one record per cluster, on that cluster's
partition, or UNAVAILABLE when the bus does not answer."""

from __future__ import annotations

import grpc
import pytest
from aiokafka.partitioner import DefaultPartitioner
from qm.v1 import budget_service_pb2, events_pb2, types_pb2

from libs.bus import EventProducer, load_topic_config
from libs.bus.memory import MemoryBus
from libs.config.budget import tree_from_mapping
from libs.core import PolicyConfig
from services.budget.book import BudgetBook
from services.budget.server import BudgetServicer
from services.status import status_of
from tests.unit.services.admission.doubles import KEYS, Aborted, Context

TOPICS = load_topic_config()
EVENTS = TOPICS.events.name
CLUSTERS = ["east", "west"]
TREE = tree_from_mapping(
    {"name": "root", "managers": ["boss"], "children": [{"name": "team-a"}, {"name": "team-b"}]}
)


def servicer(bus: MemoryBus) -> BudgetServicer:
    book = BudgetBook.for_policy(PolicyConfig())
    book.tree, book.version = TREE, 1
    producer = EventProducer(bus, client_id="budget")
    return BudgetServicer(book, producer, topic=EVENTS, clusters=CLUSTERS, keys=KEYS)


def change(weight: float) -> budget_service_pb2.SetAllocationRequest:
    node = types_pb2.BudgetNode(name="team-b", parent="root", weight=weight)
    return budget_service_pb2.SetAllocationRequest(node=node)


async def test_a_change_is_appended_to_every_clusters_input() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    tree = (await servicer(bus).SetAllocation(change(3.0), Context("boss"))).tree
    assert tree.version == 2
    records = bus.records(EVENTS)
    partitions = list(range(TOPICS.events.partitions))
    assert sorted((r.key, r.partition) for r in records) == sorted(
        (c.encode(), DefaultPartitioner()(c.encode(), partitions, partitions)) for c in CLUSTERS
    )
    changed = [env.budget_changed for env in bus.envelopes(EVENTS)]
    assert {(c.tree.version, c.changed_by, c.node) for c in changed} == {(2, "boss", "team-b")}


async def test_a_bus_that_does_not_answer_makes_the_change_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.budget.server.WRITE_TIMEOUT_S", 0.05)
    bus = MemoryBus.for_topics(TOPICS)
    bus.down = True
    with pytest.raises(TimeoutError) as raised:
        await servicer(bus).SetAllocation(change(3.0), Context("boss"))
    assert status_of(raised.value)[0] == grpc.StatusCode.UNAVAILABLE
    assert bus.records(EVENTS) == []


class FoldingProducer(EventProducer):
    """A producer whose records the book's follower folds before the write is
    acknowledged, as a loaded machine schedules it."""

    def __init__(self, bus: MemoryBus, book: BudgetBook) -> None:
        super().__init__(bus, client_id="budget")
        self.book = book
        self.written: list[events_pb2.Envelope] = []

    async def send(self, topic: str, env: events_pb2.Envelope, *, key: str | None = None) -> None:
        await super().send(topic, env, key=key)
        self.written.append(env)
        self.book.apply(env)


async def test_a_change_folded_back_before_its_ack_keeps_its_version() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    book = BudgetBook.for_policy(PolicyConfig())
    book.adopt(TREE, 1)
    producer = FoldingProducer(bus, book)
    budget = BudgetServicer(book, producer, topic=EVENTS, clusters=CLUSTERS, keys=KEYS)
    first = await budget.SetAllocation(change(3.0), Context("boss"))
    second = await budget.SetAllocation(change(5.0), Context("boss"))
    assert (first.tree.version, second.tree.version) == (2, 3)
    assert sorted(env.budget_changed.tree.version for env in bus.envelopes(EVENTS)) == [2, 2, 3, 3]
    # A follower that reads the first change only now does not undo the second.
    book.apply(producer.written[0])
    assert book.version == 3
    assert book.tree is not None and book.tree.node("team-b").weight == 5.0


async def test_a_change_read_from_an_older_tree_is_refused_not_merged() -> None:
    """Two managers edit from version 1; the second would undo the first's change."""
    bus = MemoryBus.for_topics(TOPICS)
    budget = servicer(bus)
    first = change(3.0)
    first.expected_version = 1
    assert (await budget.SetAllocation(first, Context("boss"))).tree.version == 2
    stale = change(5.0)
    stale.expected_version = 1
    with pytest.raises(Aborted) as refused:
        await budget.SetAllocation(stale, Context("boss"))
    assert refused.value.code == grpc.StatusCode.ABORTED
    assert "changed meanwhile (version 2, not 1)" in refused.value.details
    assert [e.budget_changed.tree.version for e in bus.envelopes(EVENTS)] == [2, 2]  # 2 clusters


async def test_a_change_that_changes_nothing_keeps_the_version_and_writes_nothing() -> None:
    bus = MemoryBus.for_topics(TOPICS)
    budget = servicer(bus)
    same = budget_service_pb2.SetAllocationRequest(
        node=types_pb2.BudgetNode(name="team-b", parent="root", weight=1.0), expected_version=1
    )
    assert (await budget.SetAllocation(same, Context("boss"))).tree.version == 1
    assert bus.records(EVENTS) == []
    with pytest.raises(Aborted) as refused:  # still only a manager's to ask
        await budget.SetAllocation(same, Context("nobody"))
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


async def test_usage_shows_each_caller_the_allocations_they_may_see() -> None:
    tree = tree_from_mapping(
        {
            "name": "root",
            "managers": ["boss"],
            "children": [{"name": "team-a", "members": ["ann"]}, {"name": "team-b"}],
        }
    )
    book = BudgetBook.for_policy(PolicyConfig())
    book.adopt(tree, 1)
    producer = EventProducer(MemoryBus.for_topics(TOPICS), client_id="budget")
    budget = BudgetServicer(
        book, producer, topic=EVENTS, clusters=CLUSTERS, keys=KEYS, operators={"olga"}
    )
    request = budget_service_pb2.GetUsageRequest()

    async def seen(user: str) -> list[str]:
        reply = await budget.GetUsage(request, Context(user))
        return [level.allocation for level in reply.allocations]

    assert await seen("ann") == ["team-a"]
    assert await seen("boss") == await seen("olga") == ["team-a", "team-b"]
    assert await seen("stranger") == []
