"""Who may say what on the event log: the roles that may write each event type.

The broker's ACLs (``access.py``) decide who may write the ``events`` topic at all;
this table decides what each writer may say there, and every reader that folds the
log checks it (``libs/trust/gate.py``) on the record's signer. A node agent speaks
only about its own node: ``about_node`` names the node a record is about, and it must
be the signer's. An event type no role may write (placement's decisions) is refused
on the event log whoever signed it.
"""

from __future__ import annotations

from typing import Final, Literal

from qm.v1 import events_pb2

Role = Literal["admission", "budget", "ticker", "projector", "node"]
ROLES: Final[tuple[Role, ...]] = ("admission", "budget", "ticker", "projector", "node")

# The service roles, whose keys are in the trust file; a node's key is approved on the
# log itself (qm node approve).
SERVICE_ROLES: Final[tuple[Role, ...]] = ("admission", "budget", "ticker", "projector")

WRITERS: Final[dict[str, Role]] = {
    # A user's or an operator's request, judged by admission.
    "job_submitted": "admission",
    "job_admitted": "admission",
    "job_rejected": "admission",
    "job_cancel_requested": "admission",
    "job_held": "admission",
    "job_updated": "admission",
    "node_cordoned": "admission",
    "node_approved": "admission",
    "node_revoked": "admission",
    "budget_changed": "budget",
    "clock_tick": "ticker",
    "usage_snapshot": "projector",
    # A node's reports, about that node only.
    "node_registered": "node",
    "node_heartbeat": "node",
    "task_started": "node",
    "task_finished": "node",
    "task_failed": "node",
    "task_refused": "node",
    "task_idle": "node",
    "task_checkpointed": "node",
    "model_loaded": "node",
    "model_evicted": "node",
}


def about_node(env: events_pb2.Envelope) -> str | None:
    """The node a node's report is about; None for any other record."""
    kind = env.WhichOneof("payload")
    if kind is None or WRITERS.get(kind) != "node":
        return None
    if kind == "node_registered":
        return env.node_registered.inventory.node_id
    node_id: str = getattr(env, kind).node_id
    return node_id
