"""One scheduler step on the log: an input envelope in, decision envelopes out.

The placement service and the audit replayer both call :func:`decide`, so a
replay of the same input yields the same output bytes. Everything in an output
envelope derives from the input: its id from the input position, its time
from the input's time, its producer from the policy (not the instance).
"""

from __future__ import annotations

from qm.v1 import events_pb2, types_pb2

from libs.core import POLICY, POLICY_VERSION, PolicyConfig, Scheduler
from libs.events.convert import decision_payload, to_input
from libs.events.envelope import new_envelope

PRODUCER = "placement"


def decide(
    scheduler: Scheduler, env: events_pb2.Envelope, *, partition: int, offset: int
) -> list[events_pb2.Envelope]:
    core_input = to_input(env)
    if core_input is None:
        return []
    decisions = scheduler.handle(core_input)
    if not decisions:
        return []
    provenance = types_pb2.Provenance(
        input_partition=partition,
        input_offset=offset,
        state_digest=scheduler.digest(),
        policy=POLICY,
        policy_version=POLICY_VERSION,
    )
    return [
        new_envelope(
            decision_payload(decision, provenance),
            producer=PRODUCER,
            cluster=env.cluster,
            correlation_id=decision.job_id,
            causation_id=env.event_id,
            occurred=env.occurred_at.ToDatetime(),
            event_id=f"{env.cluster}-p{partition}-o{offset}-d{index}",
        )
        for index, decision in enumerate(decisions)
    ]


class PartitionSchedulers:
    """The schedulers of one input partition: one per cluster whose events land there.

    Clusters are keyed onto partitions by hash, so two may share one; each still
    gets a scheduler of its own and never sees the other's nodes.
    """

    def __init__(self, config: PolicyConfig) -> None:
        self._config = config
        self._by_cluster: dict[str, Scheduler] = {}

    def decide(
        self, env: events_pb2.Envelope, *, partition: int, offset: int
    ) -> list[events_pb2.Envelope]:
        scheduler = self._by_cluster.get(env.cluster)
        if scheduler is None:
            scheduler = self._by_cluster[env.cluster] = Scheduler(self._config)
        return decide(scheduler, env, partition=partition, offset=offset)
