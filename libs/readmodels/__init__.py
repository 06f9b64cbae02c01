"""Read models: pure folds of envelopes into the ``qm.v1.Job`` and ``qm.v1.Node`` views.

No I/O here; the projector service stores what these functions return.
"""

from libs.readmodels.jobs import (
    DEFAULT_LIST_LIMIT,
    apply_job_event,
    has_ended,
    job_key,
    newest_jobs,
)
from libs.readmodels.nodes import apply_node_event, node_key, nodes_in_cluster, without_ended_tasks

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "apply_job_event",
    "apply_node_event",
    "has_ended",
    "job_key",
    "newest_jobs",
    "node_key",
    "nodes_in_cluster",
    "without_ended_tasks",
]
