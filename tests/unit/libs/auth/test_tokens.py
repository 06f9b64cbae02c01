"""Tokens: who they name, for how long, for whom, signed by which key; and the secrets
a service refuses to sign with."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from libs.auth import AuthError, Keys, ServiceToken, issue_token, load_keys, verify_token
from libs.auth.tokens import key_id
from libs.config.document import ConfigError

KEY = b"k" * 32
KEYS = Keys((KEY,))


def test_a_token_names_its_user_and_its_key() -> None:
    token = issue_token("alice", KEYS)
    assert verify_token(token, KEYS) == "alice"
    assert jwt.get_unverified_header(token)["kid"] == key_id(KEY) != KEY.hex()[:16]


def test_a_token_from_another_installation_is_refused() -> None:
    with pytest.raises(AuthError, match="key this installation does not know"):
        verify_token(issue_token("alice", Keys((b"o" * 32,))), KEYS)


def test_an_expired_token_is_refused_and_a_fresh_one_is_not() -> None:
    an_hour_ago = time.time() - 3600
    with pytest.raises(AuthError, match="expired"):
        verify_token(issue_token("alice", KEYS, ttl_s=60, now=an_hour_ago), KEYS)
    assert verify_token(issue_token("alice", KEYS, ttl_s=7200, now=an_hour_ago), KEYS) == "alice"


def test_a_token_for_another_audience_or_issuer_is_refused() -> None:
    with pytest.raises(AuthError, match="another audience"):
        verify_token(issue_token("alice", Keys((KEY,), audience="billing")), KEYS)
    with pytest.raises(AuthError, match="another issuer"):
        verify_token(issue_token("alice", Keys((KEY,), issuer="elsewhere")), KEYS)


def claims(**changes: object) -> dict[str, object]:
    now = int(time.time())
    base: dict[str, object] = {
        "sub": "alice", "iss": "quartermaster", "aud": "quartermaster",
        "iat": now, "exp": now + 600,
    }  # fmt: skip
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (jwt.encode(claims(), "", algorithm="none"), "'none', which this installation"),
        (jwt.encode(claims(sub="root"), KEY * 2, algorithm="HS512"), "'HS512'"),
        (jwt.encode(claims(exp=None), KEY, headers={"kid": key_id(KEY)}), "lacks the 'exp'"),
        (jwt.encode(claims(sub=None), KEY, headers={"kid": key_id(KEY)}), "lacks the 'sub'"),
        (jwt.encode(claims(sub=" a b"), KEY, headers={"kid": key_id(KEY)}), "invalid user"),
        (jwt.encode(claims(), KEY), "does not know"),  # no kid
        ("", "malformed"),
        ("qm1.YWxpY2U.00", "malformed"),
        ("a.b.c", "malformed"),
    ],
)
def test_unsigned_forged_and_malformed_tokens_are_refused(token: str, message: str) -> None:
    with pytest.raises(AuthError, match=message):
        verify_token(token, KEYS)


def test_a_signature_moved_onto_another_user_is_refused() -> None:
    header, _, signature = issue_token("alice", KEYS).split(".")
    forged = jwt.encode(claims(sub="root"), b"x" * 32).split(".")[1]
    with pytest.raises(AuthError, match="signature does not match"):
        verify_token(f"{header}.{forged}.{signature}", KEYS)


def test_rotation_keeps_old_tokens_valid_while_the_new_key_signs(tmp_path: Path) -> None:
    old, new = b"o" * 32, b"n" * 32
    issued_before = issue_token("alice", Keys((old,)))
    (tmp_path / "keys").write_bytes(new + b"\n" + old + b"\n")
    rotated = load_keys({"QM_AUTH_SECRET_FILE": str(tmp_path / "keys")})
    assert verify_token(issued_before, rotated) == "alice"
    assert jwt.get_unverified_header(issue_token("bob", rotated))["kid"] == key_id(new)
    with pytest.raises(AuthError, match="does not know"):
        verify_token(issued_before, Keys((new,)))  # once the old key is dropped


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("short", "5 bytes, fewer than 32"),
        ("REPLACE-ME-this-placeholder-is-not-a-secret", "looks like a placeholder"),
    ],
)
def test_a_service_refuses_a_short_or_placeholder_secret(secret: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_keys({"QM_AUTH_SECRET": secret})
    assert load_keys({"QM_AUTH_SECRET": secret, "QM_AUTH_INSECURE_DEV": "1"}).secrets


def test_no_secret_names_the_settings() -> None:
    with pytest.raises(ConfigError, match="QM_AUTH_SECRET_FILE"):
        load_keys({})


def test_a_service_token_is_renewed_before_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    token = ServiceToken("svc-admission", KEYS, ttl_s=600)
    first = token()
    clock[0] += 200
    assert token() == first
    clock[0] += 200  # past half its life
    renewed = token()
    assert renewed != first
    assert jwt.decode(renewed, options={"verify_signature": False})["exp"] == 1_000_400 + 600
