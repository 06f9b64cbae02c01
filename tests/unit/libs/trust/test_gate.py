"""The gate: who signed a record, with a key it trusts, and may they say it."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st
from qm.v1 import events_pb2, types_pb2

from libs.auth.keyfiles import raw_public
from libs.core.approvals import ApprovedKey
from libs.events import decode, encode, new_envelope
from libs.trust import Gate, SigningKey, TrustFile, load_trust, seal
from libs.trust.keys import node_key_id, service_key_id
from libs.trust.trustfile import TrustDocument

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _service(role: str) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    return SigningKey(private, service_key_id(role, raw_public(private.public_key())))


ADMISSION, BUDGET, STOLEN, OLD = (_service(r) for r in ("admission", "budget", "budget", "ticker"))


def _node(node_id: str) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    return SigningKey(private, node_key_id(node_id, raw_public(private.public_key())))


A, B = _node("a"), _node("b")


def _entry(key: SigningKey, role: str, **more: object) -> dict[str, object]:
    return {"role": role, "public_key": base64.b64encode(key.public).decode(), **more}


TRUST = TrustFile.of(
    TrustDocument.model_validate(
        {
            "keys": [
                _entry(ADMISSION, "admission"),
                _entry(BUDGET, "budget"),
                _entry(STOLEN, "budget", revoked=True),
                _entry(OLD, "ticker", not_after=AT),
            ]
        }
    )
)
APPROVED = {"a": ApprovedKey(A.public), "b": ApprovedKey(B.public, revoked=True)}
PLACED = {("j", "j/0"): "a", ("k", "k/0"): "c"}


def _check(record: bytes, approved: dict[str, ApprovedKey] = APPROVED) -> str | None:
    verdict = Gate(TRUST).check(
        decode(record), record, approved.get, lambda job, task: PLACED.get((job, task))
    )
    return None if verdict is None else verdict.code


def _sealed(payload: Message, key: SigningKey, at: datetime = AT) -> bytes:
    return seal(new_envelope(payload, producer="test", occurred=at), key)


def _admitted(user: str = "alice") -> events_pb2.JobAdmitted:
    return events_pb2.JobAdmitted(job_id="j", spec=types_pb2.JobSpec(user=user, gpus=1))


def _finished(node_id: str, job: str = "j") -> events_pb2.TaskFinished:
    return events_pb2.TaskFinished(job_id=job, task_id=f"{job}/0", node_id=node_id)


def test_a_writer_in_its_role_passes() -> None:
    assert _check(_sealed(_admitted(), ADMISSION)) is None
    assert _check(_sealed(events_pb2.BudgetChanged(), BUDGET)) is None
    assert _check(_sealed(_finished("a"), A)) is None


def test_an_unsigned_record_is_refused() -> None:
    env = new_envelope(_admitted(), producer="test", occurred=AT)
    assert _check(encode(env)) == "unsigned"
    env.key_id = ADMISSION.key_id  # names a key, carries no signature
    assert _check(encode(env)) == "unsigned"


def test_a_changed_record_does_not_verify() -> None:
    record = _sealed(_admitted("alice"), ADMISSION)
    forged = record.replace(b"alice", b"mallo")
    assert _check(forged) == "bad_signature"


@given(st.data())
def test_no_single_changed_byte_passes(data: st.DataObject) -> None:
    record = bytearray(_sealed(_admitted(), ADMISSION))
    at = data.draw(st.integers(0, len(record) - 1))
    record[at] ^= data.draw(st.integers(1, 255))
    try:
        decode(bytes(record))
    except ValueError:
        return  # not even an envelope: dead-lettered before the gate
    assert _check(bytes(record)) is not None


def test_keys_the_trust_file_does_not_list_are_refused() -> None:
    assert _check(_sealed(_admitted(), _service("admission"))) == "unknown_key"


def test_a_revoked_key_is_refused_and_a_retired_one_after_its_time() -> None:
    assert _check(_sealed(events_pb2.BudgetChanged(), STOLEN)) == "revoked_key"
    earlier = datetime(2026, 11, 30, tzinfo=UTC)
    assert _check(_sealed(events_pb2.ClockTick(), OLD, earlier)) is None
    assert _check(_sealed(events_pb2.ClockTick(), OLD, AT)) == "revoked_key"


def test_a_writer_may_say_only_what_its_role_says() -> None:
    assert _check(_sealed(_admitted(), BUDGET)) == "out_of_role"
    assert _check(_sealed(_admitted(), A)) == "out_of_role"
    placed = events_pb2.TaskPlaced(job_id="j", task_id="j/0", node_id="a")
    assert _check(_sealed(placed, ADMISSION)) == "out_of_role"  # placement's, not the log's


def test_a_node_reports_only_about_itself_and_its_own_tasks() -> None:
    assert _check(_sealed(_finished("c", "k"), A)) == "out_of_role"  # another node's
    assert _check(_sealed(_finished("a", "k"), A)) == "out_of_role"  # a task on c, said on a
    registered = events_pb2.NodeRegistered(inventory=types_pb2.NodeInventory(node_id="c"))
    assert _check(_sealed(registered, A)) == "out_of_role"


def test_a_node_no_operator_approved_is_refused() -> None:
    stranger = _node("c")
    registered = events_pb2.NodeRegistered(
        inventory=types_pb2.NodeInventory(node_id="c"), public_key=stranger.public
    )
    assert _check(_sealed(registered, stranger)) == "unapproved_node"
    assert _check(_sealed(_finished("a"), _node("a"))) == "unapproved_node"  # a's name, not key


def test_a_registration_offering_a_key_it_cannot_sign_with_is_a_bad_signature() -> None:
    stranger = _node("c")
    registered = events_pb2.NodeRegistered(
        inventory=types_pb2.NodeInventory(node_id="c"), public_key=stranger.public
    )
    env = new_envelope(registered, producer="test", occurred=AT)
    record = seal(env, _node("c"))
    forged = decode(record)
    forged.key_id = stranger.key_id  # claims the offered key, signed with another
    body = encode_unsigned(forged)
    assert _check(body + record[-66:]) == "bad_signature"


def encode_unsigned(env: events_pb2.Envelope) -> bytes:
    env.ClearField("signature")
    return encode(env)


def test_a_revoked_node_is_refused() -> None:
    assert _check(_sealed(_finished("b"), B)) == "revoked_key"


def test_a_trust_file_is_checked_as_it_loads(tmp_path: Path) -> None:
    path = tmp_path / "trust.yaml"
    path.write_text("keys:\n- role: node\n  public_key: AAAA\n")
    with pytest.raises(ValueError, match="role"):
        load_trust(path)
    path.write_text(
        f"keys:\n- role: budget\n  public_key: {base64.b64encode(b'x' * 31).decode()}\n"
    )
    with pytest.raises(ValueError, match="32 bytes"):
        load_trust(path)
    path.write_text("keys: []\n")
    with pytest.raises(ValueError, match="every record would be refused"):
        load_trust(path)


def test_a_sealed_record_encodes_again_to_itself() -> None:
    record = _sealed(_admitted(), ADMISSION)
    assert encode(decode(record)) == record
    assert _check(encode(decode(record))) is None


def test_a_reader_without_node_state_trusts_only_services_records() -> None:
    gate = Gate(TRUST)
    for record, trusted in (
        (_sealed(_admitted(), ADMISSION), True),
        (_sealed(_admitted(), BUDGET), False),  # out of its role
        (_sealed(_finished("a"), A), False),  # a node's: it needs the node's key
        (encode(new_envelope(_admitted(), producer="test", occurred=AT)), False),
    ):
        assert gate.from_service(decode(record), record) is trusted


def test_a_signature_checked_once_vouches_for_its_own_bytes_only() -> None:
    gate = Gate(TRUST)
    record = _sealed(_admitted("alice"), ADMISSION)
    forged = record.replace(b"alice", b"mallo")  # the same signature, other bytes
    for _ in range(2):  # the second time from what the gate remembers
        assert gate.check(decode(record), record, APPROVED.get, lambda j, t: None) is None
        verdict = gate.check(decode(forged), forged, APPROVED.get, lambda j, t: None)
        assert verdict is not None and verdict.code == "bad_signature"
