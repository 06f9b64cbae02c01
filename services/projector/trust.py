"""The gate in front of every fold of the events topic (``libs.trust.gate``).

Loaded from ``QM_TRUST_FILE`` (required: the worker does not start without it, see
``__main__``). Each record of the events topic is checked before it is folded;
placement's decisions topic has one writer (the broker's ACLs), its records are not
signed and are not checked.

What the gate asks about nodes comes from the log itself: a node's approved key from
the ``nodes`` table (the nodes agent folds admission's ``node_approved`` and
``node_revoked`` there, once they passed the gate), the node a task runs on from the
jobs tables (placement's ``task_placed``). The jobs agent reads the nodes agent's table,
and both agents read the jobs agent's tables, as they are when the record is checked:
the agents are not in step, so a report that follows its node's approval (or its
task's placement) by a few records may be judged before that is folded (and refused),
or one that follows a revocation just after it, before. Placement's own check is
exact, and it is placement that places and charges. The usage ledger judges records on
its own state instead (``services.projector.usage.agents``).
"""

from __future__ import annotations

import functools

from qm.v1 import events_pb2

from libs.core.approvals import ApprovedKey
from libs.events.envelope import DEFAULT_CLUSTER
from libs.readmodels import approved_key
from libs.trust import Gate, Rejection
from services.projector.app import TOPICS
from services.projector.jobs.tables import records
from services.projector.nodes.tables import get_node
from services.trust import gate_from_env


@functools.cache
def gate() -> Gate:
    """The gate, with the trust file's keys (``QM_TRUST_FILE``); read once, when first
    asked for (the worker asks before it starts)."""
    return gate_from_env()


def is_signed(topic: str) -> bool:
    """Whether records of ``topic`` are checked: all but the decisions topic's."""
    return topic != TOPICS.decisions.name


def refusal(env: events_pb2.Envelope, record: bytes) -> Rejection | None:
    """Why the events topic's ``record`` (decoded: ``env``) must not be folded into the
    job and node views; None when it may be."""
    cluster = env.cluster or DEFAULT_CLUSTER

    def node_key(node_id: str) -> ApprovedKey | None:
        node = get_node(node_id)
        # Node ids are the table's keys: a key approved in another cluster is not this one's.
        if node is None or (node.inventory.cluster or DEFAULT_CLUSTER) != cluster:
            return None
        return approved_key(node)

    return gate().check(env, record, node_key, records.task_node)
