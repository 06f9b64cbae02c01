"""Placement's step behind the gate: a refused input folds nothing, its refusal is a
decision, and a replay behind the same gate refuses the same, byte for byte."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.audit.replay import Replay
from libs.auth.keyfiles import raw_public
from libs.core import PolicyConfig
from libs.events import decode, encode, event_type, new_envelope
from libs.events.log_step import PartitionSchedulers
from libs.trust import Gate, SigningKey, TrustFile
from libs.trust.keys import node_key_id, service_key_id
from libs.trust.trustfile import TrustDocument

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _key(key_id: str) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    public = raw_public(private.public_key())
    return SigningKey(private, key_id.format(fp=service_key_id("x", public)[2:]))


ADMISSION = _key("admission:{fp}")
N1, N2 = _key("node:n1:{fp}"), _key("node:n2:{fp}")
TRUST = TrustFile.of(
    TrustDocument.model_validate(
        {"keys": [{"role": "admission", "public_key": base64.b64encode(ADMISSION.public).decode()}]}
    )
)


def _record(payload: Message, key: SigningKey | None, second: int) -> bytes:
    env = new_envelope(payload, producer="test", occurred=T0 + timedelta(seconds=second))
    return key.seal(env) if key is not None else encode(env)


def _registered(node_id: str) -> events_pb2.NodeRegistered:
    gpus = [types_pb2.Gpu(index=i, type="H100") for i in range(4)]
    return events_pb2.NodeRegistered(
        inventory=types_pb2.NodeInventory(node_id=node_id, gpus=gpus),
        public_key={"n1": N1, "n2": N2}[node_id].public,
    )


def _admitted(job_id: str) -> events_pb2.JobAdmitted:
    spec = types_pb2.JobSpec(allocation="a", user="alice", gpus=2, command=["true"])
    return events_pb2.JobAdmitted(job_id=job_id, spec=spec)


LOG = [
    _record(_registered("n1"), N1, 0),  # before its approval: refused
    _record(events_pb2.NodeApproved(node_id="n1", public_key=N1.public), ADMISSION, 1),
    _record(_registered("n1"), N1, 2),
    _record(_admitted("forged"), N1, 3),  # a node's key, an admission's event
    _record(_admitted("unsigned"), None, 4),
    _record(_admitted("j1"), ADMISSION, 5),
    _record(_registered("n2"), N2, 6),  # never approved
    _record(events_pb2.TaskFinished(job_id="j1", task_id="j1/0", node_id="n1"), N2, 7),
    _record(events_pb2.NodeRevoked(node_id="n1"), ADMISSION, 8),
    _record(events_pb2.NodeHeartbeat(node_id="n1"), N1, 9),
]


def _decide(gate: Gate | None) -> list[events_pb2.Envelope]:
    schedulers = PartitionSchedulers(PolicyConfig(), gate=gate)
    return [
        out
        for offset, record in enumerate(LOG)
        for out in schedulers.decide(decode(record), partition=0, offset=offset, record=record)
    ]


def test_refused_inputs_fold_nothing_and_say_why() -> None:
    outputs = _decide(Gate(TRUST))
    refused = {
        out.input_refused.provenance.input_offset: out.input_refused.trust
        for out in outputs
        if out.input_refused.trust
    }
    assert refused == {
        0: "unapproved_node",
        3: "out_of_role",
        4: "unsigned",
        6: "unapproved_node",
        7: "unapproved_node",
        9: "revoked_key",
    }
    kinds = [event_type(out) for out in outputs if not out.input_refused.trust]
    assert kinds.count("task_placed") == 1  # j1 only: the forged and unsigned never run
    placed = next(out.task_placed for out in outputs if event_type(out) == "task_placed")
    assert placed.job_id == "j1"
    lost = [out.node_lost for out in outputs if event_type(out) == "node_lost"]
    assert [n.node_id for n in lost] == ["n1"] and "revoked" in lost[0].reason


def test_a_refusal_leaves_the_state_as_it_was() -> None:
    schedulers = PartitionSchedulers(PolicyConfig(), gate=Gate(TRUST))
    digests = []
    for offset, record in enumerate(LOG[:5]):
        outputs = schedulers.decide(decode(record), partition=0, offset=offset, record=record)
        digests.append(schedulers.of("default").digest())
        if offset in (3, 4):
            assert outputs[0].input_refused.provenance.state_digest == digests[2]
    assert digests[2] == digests[3] == digests[4]


def test_the_replay_refuses_the_same_and_only_behind_the_same_gate() -> None:
    recorded = _decide(Gate(TRUST))

    def audit(gate: Gate | None) -> Replay:
        replay = Replay(gate=gate)
        for offset, record in enumerate(LOG):
            replay.feed_input(0, offset, decode(record), record)
        for out in recorded:
            replay.feed_recorded(out)
        replay.end_inputs()
        replay.end_recorded()
        return replay

    same = audit(Gate(TRUST)).finish()
    assert same.ok and same.reproduced == len(recorded)
    assert not audit(None).finish().ok  # folding what placement refused diverges


def test_a_node_key_id_names_its_node() -> None:
    assert N1.key_id.startswith("node:n1:") and N1.key_id == node_key_id("n1", N1.public)
