"""Who may do what on the bus: one Kafka principal per service, and the least it needs.

The broker refuses whatever no grant here allows (``deploy/local/kafka.sh`` runs the
StandardAuthorizer; the Kubernetes manifests declare the same grants as Strimzi
``KafkaUser`` resources). Topics are named by their key in the topics file, so a
deployment that renames them keeps the same rules. Consumer groups and transactional
ids are matched by prefix: placement's group is ``qm-placement`` or any name that starts
with it, so that several stacks (and tests) can share one broker.

The shared event log (``events``) has several writers; what a writer may say there is
not enforced by the broker, only who may write at all. Decisions have one writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from libs.bus.topics import Topics

TopicKey = Literal[
    "events", "decisions", "deadletter", "jobs_view", "job_specs_view", "job_tasks_view",
    "nodes_view", "snapshots", "usage_snapshots",
]  # fmt: skip
Operation = Literal["Read", "Write", "Describe", "Create", "DescribeConfigs"]
ResourceType = Literal["topic", "group", "transactionalId"]
PatternType = Literal["literal", "prefix"]

_TRANSACTIONS: tuple[Operation, ...] = ("Write", "Describe")
_OWNER: tuple[Operation, ...] = ("Create", "Read", "Write", "Describe", "DescribeConfigs")
_VIEWS: tuple[TopicKey, ...] = ("jobs_view", "job_specs_view", "job_tasks_view", "nodes_view")


@dataclass(frozen=True)
class Principal:
    """A service's account on the bus (SASL user ``name``)."""

    name: str
    reads: tuple[TopicKey, ...] = ()
    writes: tuple[TopicKey, ...] = ()
    # Consumer groups (and, for a transactional producer, transactional ids) it may use.
    group_prefix: str | None = None
    transactional_prefix: str | None = None
    # Topics it creates and keeps itself (faust's internal topics), by name prefix.
    owned_prefix: str | None = None
    # Groups whose committed offsets it may look at (and not join).
    watched_group_prefix: str | None = None


PRINCIPALS: tuple[Principal, ...] = (
    Principal("admission", reads=("events",), writes=("events",)),
    Principal("budget", reads=("events", "decisions"), writes=("events",)),
    Principal("ticker", writes=("events",)),
    Principal(
        "placement",
        reads=("events", "snapshots"),
        writes=("decisions", "deadletter", "snapshots"),
        group_prefix="qm-placement",
        transactional_prefix="qm-placement",
    ),
    Principal(
        "node-agent",
        reads=("decisions",),
        writes=("events", "deadletter"),
        group_prefix="qm-node-agent",
    ),
    Principal(
        "projector",
        reads=("events", "decisions", *_VIEWS, "usage_snapshots"),
        # Usage snapshots go on the event log (services/projector/usage); its ledger's own
        # snapshots, on theirs.
        writes=("events", "deadletter", *_VIEWS, "usage_snapshots"),
        group_prefix="qm-projector",
        owned_prefix="qm-projector",
    ),
    # `qm audit verify`: replays the log up to placement's committed offsets, changes nothing.
    Principal(
        "auditor", reads=("events", "decisions", "snapshots"), watched_group_prefix="qm-placement"
    ),
)

# The broker's own superuser (created by deploy/local/kafka.sh): creates topics and
# principals, and is the operator's account. No service runs as it.
ADMIN = "admin"


@dataclass(frozen=True, order=True)
class Grant:
    """One allow rule: ``principal`` may ``operation`` on the resource."""

    principal: str
    resource: ResourceType
    name: str
    pattern: PatternType
    operation: Operation


def grants(topics: Topics) -> list[Grant]:
    """Every allow rule of every principal, for topics named as ``topics`` names them."""
    rules: set[Grant] = set()
    for p in PRINCIPALS:
        for key in p.reads:
            rules.add(Grant(p.name, "topic", getattr(topics, key).name, "literal", "Read"))
        for key in p.writes:
            rules.add(Grant(p.name, "topic", getattr(topics, key).name, "literal", "Write"))
            # Producers look up the topic's partitions before they write.
            rules.add(Grant(p.name, "topic", getattr(topics, key).name, "literal", "Describe"))
        if p.group_prefix:
            rules.add(Grant(p.name, "group", p.group_prefix, "prefix", "Read"))
        if p.transactional_prefix:
            for txn_op in _TRANSACTIONS:
                rules.add(
                    Grant(p.name, "transactionalId", p.transactional_prefix, "prefix", txn_op)
                )
        if p.owned_prefix:
            for topic_op in _OWNER:
                rules.add(Grant(p.name, "topic", p.owned_prefix, "prefix", topic_op))
            rules.add(Grant(p.name, "group", p.owned_prefix, "prefix", "Read"))
        if p.watched_group_prefix:
            rules.add(Grant(p.name, "group", p.watched_group_prefix, "prefix", "Describe"))
    return sorted(rules)
