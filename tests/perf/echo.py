"""``python -m tests.perf.echo``: the live benchmark's baseline, placement minus the scheduler.

It is the placement service's own loop (consumer group, read_committed, the
idempotent transactional producer, one transaction per poll with its offsets,
a span and a log line per output), with the scheduler swapped out: each
JobAdmitted gets a TaskPlaced at once, on a node picked round-robin, with no
scheduling state (so no fold and no digest).

Settings as placement's (``QM_PLACEMENT_GROUP``, here by default ``qm-echo``;
``QM_POLICY_FILE``; the Kafka settings), plus ``QM_ECHO_NODES`` (how many nodes named
``sim-NNNN``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from qm.v1 import events_pb2, types_pb2

from libs.bus import Delivery
from libs.events import event_type, new_envelope
from libs.events.log_step import PartitionSchedulers
from services.placement.environment import from_env
from services.placement.service import PlacementService
from services.placement.standby import Warm
from services.runtime import run_service


def node_name(index: int) -> str:
    return f"sim-{index:04d}"


@dataclass
class Echo(PlacementService):
    nodes: int = 1
    count: int = 0

    async def warm(self, partition: int, upto: int) -> Warm:
        return Warm(PartitionSchedulers(self.policy), upto)  # nothing to replay

    def outputs(self, delivery: Delivery) -> list[events_pb2.Envelope]:
        env = delivery.envelope
        if event_type(env) != "job_admitted":
            return []
        admitted = env.job_admitted
        node = node_name(self.count % self.nodes)
        self.count += 1
        placed = events_pb2.TaskPlaced(
            job_id=admitted.job_id,
            task_id=f"{admitted.job_id}/0",
            node_id=node,
            gpu_indices=list(range(admitted.spec.gpus)),
            spec=admitted.spec,
            provenance=types_pb2.Provenance(
                input_partition=delivery.partition,
                input_offset=delivery.offset,
                policy="echo",
                policy_version=1,
            ),
        )
        return [
            new_envelope(
                placed,
                producer="placement",
                cluster=env.cluster,
                correlation_id=admitted.job_id,
                causation_id=env.event_id,
                occurred=env.occurred_at.ToDatetime(),
                event_id=f"{env.cluster}-p{delivery.partition}-o{delivery.offset}-d0",
            )
        ]


def main() -> None:
    nodes = int(os.environ.get("QM_ECHO_NODES", "1"))
    run_service("echo", lambda: replace(from_env(Echo, "qm-echo"), nodes=nodes).run())


if __name__ == "__main__":
    main()
