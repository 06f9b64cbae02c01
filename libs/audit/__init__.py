"""The audit replayer: decide the input log again and compare with the recorded decisions.

The third driver of the core (after placement and the simulator). ``replay``
holds the pure comparison, ``kafka_source`` reads the topics into it.
"""

from libs.audit.divergence import Difference, Divergence
from libs.audit.kafka_source import audit_topics
from libs.audit.parallel import audit_parallel, default_workers
from libs.audit.replay import AuditResult, OtherRelease, Replay, audit_logs
from libs.audit.versions import policy_commits

__all__ = [
    "AuditResult",
    "Difference",
    "Divergence",
    "OtherRelease",
    "Replay",
    "audit_logs",
    "audit_parallel",
    "audit_topics",
    "default_workers",
    "policy_commits",
]
