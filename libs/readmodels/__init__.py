"""Read models: pure folds of envelopes into the job, node and usage views.

No I/O here; the projector service stores or serves what these return.
"""

from libs.readmodels.job_state import has_ended, task_is_over
from libs.readmodels.jobs import (
    ALL_JOBS,
    DEFAULT_LIST_LIMIT,
    JobFilter,
    JobRecords,
    Scope,
    apply_job_event,
    job_key,
    newest_jobs,
    scope_of,
)
from libs.readmodels.knobs import PlacementKnobs
from libs.readmodels.nodes import (
    apply_node_event,
    approved_key,
    listed,
    node_key,
    nodes_in_cluster,
    without_ended_tasks,
)
from libs.readmodels.usage import ClusterUsage, UsageLedger

__all__ = [
    "ALL_JOBS",
    "DEFAULT_LIST_LIMIT",
    "ClusterUsage",
    "JobFilter",
    "JobRecords",
    "PlacementKnobs",
    "Scope",
    "UsageLedger",
    "apply_job_event",
    "apply_node_event",
    "approved_key",
    "has_ended",
    "job_key",
    "listed",
    "newest_jobs",
    "node_key",
    "nodes_in_cluster",
    "scope_of",
    "task_is_over",
    "without_ended_tasks",
]
