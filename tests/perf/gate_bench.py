"""What checking a record's signer costs each input: ``Gate.check`` over the records
placement reads most (a node's heartbeat and task report, the ticker's tick, admission's
job), each sealed as its writer seals it. Reported beside the core's cost per input,
measured in the same run (``core_bench.py``)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.core.approvals import ApprovedKey
from libs.events import decode, new_envelope
from libs.trust import Gate, load_trust
from tests.signed_log import Signers

ROUNDS = 500


def gate_us() -> list[float]:
    """Microseconds per check, ``ROUNDS`` of each record kind."""
    with tempfile.TemporaryDirectory() as folder:
        signers = Signers(Path(folder))
        gate = Gate(load_trust(signers.trust_file))
        node = signers.node("n1")
        spec = types_pb2.JobSpec(user="alice", allocation="a", gpus=8, command=["python", "t.py"])
        records: list[tuple[Message, str]] = [
            (events_pb2.NodeHeartbeat(node_id="n1", incarnation="i"), "node"),
            (events_pb2.TaskFinished(job_id="j", task_id="j/0", node_id="n1"), "node"),
            (events_pb2.ClockTick(), "ticker"),
            (events_pb2.JobAdmitted(job_id="j", spec=spec), "admission"),
        ]
        approved = {"n1": ApprovedKey(node.public)}
        timings = []
        for payload, role in records:
            key = node if role == "node" else signers.service(role)
            # A record each round (its own id): the gate checks a record it saw lately
            # only once, and placement sees each once.
            for _ in range(ROUNDS):
                record = key.seal(new_envelope(payload, producer="bench"))
                env = decode(record)
                started = time.perf_counter_ns()
                gate.check(env, record, approved.get, lambda job, task: "n1")
                timings.append((time.perf_counter_ns() - started) / 1e3)
        return timings
