"""One scheduler step on the log: an input envelope in, decision envelopes out.

The placement service and the audit replayer both call :func:`decide`, so a
replay of the same input yields the same output bytes. Everything in an output
envelope derives from the input: its id from the input position, its time
from the input's time, its producer from the policy (not the instance).
"""

from __future__ import annotations

from qm.v1 import events_pb2, types_pb2

from libs.core import POLICY, POLICY_VERSION, Scheduler
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
