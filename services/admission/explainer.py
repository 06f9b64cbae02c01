"""Answers "why does my job wait?" from a replica of the scheduler.

The replica folds the same input log through the same core as placement, behind the
same gate (decisions discarded; admission's follower feeds it), so its explanation is
the scheduler's own reasoning, a moment behind at most. No second copy of the policy
exists anywhere.
"""

from __future__ import annotations

from qm.v1 import events_pb2

from libs.core import JobId, PolicyConfig
from libs.core.explain import Explanation
from libs.events.log_step import InputGate, PartitionSchedulers


class Explainer:
    def __init__(self, policy: PolicyConfig, gate: InputGate | None = None) -> None:
        self._schedulers = PartitionSchedulers(policy, gate=gate)

    def apply(self, env: events_pb2.Envelope, record: bytes) -> None:
        self._schedulers.fold(env, record)

    def explain(self, job_id: str, cluster: str) -> Explanation | None:
        scheduler = self._schedulers.get(cluster)
        return scheduler.explain(JobId(job_id)) if scheduler is not None else None
