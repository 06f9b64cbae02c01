"""Tokens: who they name, for how long, for whom, signed by which key, which key may sign
for whom; and the key files a service refuses."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.auth import (
    AuthError,
    Keys,
    ServiceToken,
    SigningKey,
    issue_token,
    load_keys,
    load_service_signer,
    load_signer,
    verify_token,
)
from libs.auth.keygen import PUBLIC_KEYS, keygen, public_keys_text
from libs.auth.tokens import key_id
from libs.config.document import ConfigError
from tests.forgery import claims, hmac_token

ISSUER = SigningKey.generate()  # signs for anyone
CONSOLE = SigningKey.generate()  # signs for svc-console only
KEYS = Keys((ISSUER.public(name="issuer"), CONSOLE.public(["svc-console"], "console")))

users = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_categories=("Z", "C")),
    min_size=1,
    max_size=40,
)


def test_a_token_names_its_user_and_its_key() -> None:
    token = issue_token("alice", ISSUER)
    assert verify_token(token, KEYS) == "alice"
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "EdDSA"
    assert header["kid"] == ISSUER.kid == key_id(ISSUER.private_key.public_key())


@settings(max_examples=50, deadline=None)
@given(user=users)
def test_any_user_name_round_trips(user: str) -> None:
    assert verify_token(issue_token(user, ISSUER), KEYS) == user


@settings(max_examples=50, deadline=None)
@given(user=users.filter(lambda u: u != "svc-console"))
def test_a_service_key_signs_for_its_own_subjects_only(user: str) -> None:
    assert verify_token(issue_token("svc-console", CONSOLE), KEYS) == "svc-console"
    with pytest.raises(AuthError, match=r"key console .* may not sign for it"):
        verify_token(issue_token(user, CONSOLE), KEYS)


def test_a_token_from_another_installation_is_refused() -> None:
    with pytest.raises(AuthError, match="key this installation does not know"):
        verify_token(issue_token("alice", SigningKey.generate()), KEYS)


def test_another_keys_kid_does_not_lend_its_rights() -> None:
    """A service key's token relabelled with the issuer's kid is checked against the
    issuer's key, and fails."""
    token = jwt.encode(
        claims("alice"), CONSOLE.private_key, algorithm="EdDSA", headers={"kid": ISSUER.kid}
    )
    with pytest.raises(AuthError, match="signature does not match"):
        verify_token(token, KEYS)


def test_an_expired_token_is_refused_and_a_fresh_one_is_not() -> None:
    an_hour_ago = time.time() - 3600
    with pytest.raises(AuthError, match="expired"):
        verify_token(issue_token("alice", ISSUER, ttl_s=60, now=an_hour_ago), KEYS)
    assert verify_token(issue_token("alice", ISSUER, ttl_s=7200, now=an_hour_ago), KEYS) == "alice"


def test_a_token_for_another_audience_or_issuer_is_refused() -> None:
    with pytest.raises(AuthError, match="another audience"):
        verify_token(issue_token("alice", replace(ISSUER, audience="billing")), KEYS)
    with pytest.raises(AuthError, match="another issuer"):
        verify_token(issue_token("alice", replace(ISSUER, issuer="elsewhere")), KEYS)


def public_pem(signer: SigningKey) -> bytes:
    return signer.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def raw_public(signer: SigningKey) -> bytes:
    return signer.private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def eddsa(payload: dict[str, object], kid: str | None = ISSUER.kid) -> str:
    headers = {} if kid is None else {"kid": kid}
    return jwt.encode(payload, ISSUER.private_key, algorithm="EdDSA", headers=headers)


ROOT = claims("root")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (jwt.encode(claims("root"), "", algorithm="none"), "'none', which this installation"),
        (jwt.encode(claims("root"), None, algorithm="none", headers={"kid": ISSUER.kid}), "'none'"),
        # Algorithm confusion: the public key (which every service holds) as an HMAC secret.
        (hmac_token(ROOT, public_pem(ISSUER), ISSUER.kid), "'HS256', which this installation"),
        (hmac_token(ROOT, raw_public(ISSUER), ISSUER.kid), "'HS256'"),
        (hmac_token(ROOT, public_keys_text(list(KEYS.public)).encode(), ISSUER.kid), "'HS256'"),
        (hmac_token(ROOT, public_pem(ISSUER), ISSUER.kid, "HS512"), "'HS512'"),
        (jwt.encode(ROOT, b"k" * 32, algorithm="HS256"), "'HS256'"),
        (eddsa(claims("root") | {"exp": None}), "lacks the 'exp'"),
        (eddsa({k: v for k, v in claims("root").items() if k != "exp"}), "lacks the 'exp'"),
        (eddsa({k: v for k, v in claims("root").items() if k != "sub"}), "lacks the 'sub'"),
        (eddsa(claims(" a b")), "invalid user"),
        (eddsa(claims("root"), kid=None), "does not know"),
        ("", "malformed"),
        ("qm1.YWxpY2U.00", "malformed"),
        ("a.b.c", "malformed"),
    ],
)
def test_unsigned_forged_and_malformed_tokens_are_refused(token: str, message: str) -> None:
    with pytest.raises(AuthError, match=message):
        verify_token(token, KEYS)


def test_an_rs256_or_es256_token_is_refused_without_an_identity_provider() -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(ROOT, other, algorithm="ES256", headers={"kid": ISSUER.kid})
    with pytest.raises(AuthError, match="'ES256', which this installation does not accept"):
        verify_token(token, KEYS)


def test_a_signature_moved_onto_another_user_is_refused() -> None:
    header, _, signature = issue_token("alice", ISSUER).split(".")
    forged = jwt.encode(claims("root"), b"x" * 32).split(".")[1]
    with pytest.raises(AuthError, match="signature does not match"):
        verify_token(f"{header}.{forged}.{signature}", KEYS)


def test_rotation_keeps_old_tokens_valid_while_the_new_key_signs(tmp_path: Path) -> None:
    """keygen, a key deleted, keygen again: both keys verify (the old one's tokens until
    it is dropped from the list), and the new one signs."""
    folder = tmp_path / "keys"
    keygen(folder)
    env = {
        "QM_AUTH_PUBLIC_KEYS_FILE": str(folder / PUBLIC_KEYS),
        "QM_AUTH_SIGNING_KEY_FILE": str(folder / "issuer.key"),
    }
    old = load_signer(env)
    issued_before = issue_token("alice", old)
    (folder / "issuer.key").unlink()
    made = keygen(folder)
    new = load_signer(env)
    assert new.kid != old.kid and [key.kid for key in made.kept] == [old.kid]
    rotated = load_keys(env)
    assert [key.name for key in rotated.public] == ["issuer", "admission", "console", "issuer"]
    assert verify_token(issued_before, rotated) == "alice"
    assert verify_token(issue_token("bob", new), rotated) == "bob"
    assert jwt.get_unverified_header(issue_token("bob", new))["kid"] == new.kid
    dropped = Keys(tuple(key for key in rotated.public if key.kid != old.kid))
    with pytest.raises(AuthError, match="does not know"):
        verify_token(issued_before, dropped)  # once the old key is dropped


def test_keygen_keeps_its_keys_and_writes_private_ones_for_their_owner_only(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "keys"
    first = keygen(folder)
    assert all(first.keys.values())
    content = {path: path.read_bytes() for path in first.keys}
    again = keygen(folder)
    assert not any(again.keys.values()) and again.kept == ()
    assert {path: path.read_bytes() for path in again.keys} == content
    for path in first.keys:
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert folder.stat().st_mode & 0o777 == 0o700
    public = (folder / PUBLIC_KEYS).read_text()
    assert "PRIVATE" not in public
    keys = load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(folder / PUBLIC_KEYS)})
    subjects = {key.name: key.subjects for key in keys.public}
    assert subjects == {
        "issuer": None,
        "admission": frozenset({"svc-admission", "svc-log-reader"}),
        "console": frozenset({"svc-console"}),
    }


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


PEM = ISSUER.public().pem()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a mapping"),
        ("keys: []\n", "keys: expected at least 1 item"),
        ("keys:\n  - {public_key: x}\n", r"keys\[0\].subjects: required"),
        ("keys:\n  - {subjects: svc-console, public_key: x}\n", 'expected "\\*" \\(anyone\\)'),
        ("keys:\n  - {subjects: [], public_key: x}\n", "at least 1 item"),
        ("keys:\n  - {subjects: '*', public_key: x, kid: y}\n", "unknown key"),
        ("keys:\n  - {subjects: '*', public_key: junk}\n", "not a PEM public key"),
        ("keys: [", "not valid YAML"),
    ],
)
def test_a_bad_public_keys_file_names_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path / "public-keys.yaml", text, 0o644)
    with pytest.raises(ConfigError, match=f"QM_AUTH_PUBLIC_KEYS_FILE {path}: .*{message}"):
        load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(path)})


def test_a_public_keys_file_refuses_other_kinds_of_key_and_a_key_listed_twice(
    tmp_path: Path,
) -> None:
    ecdsa = ec.generate_private_key(ec.SECP256R1()).public_key()
    pem = ecdsa.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    path = tmp_path / "public-keys.yaml"
    path.write_text(f"keys:\n  - subjects: '*'\n    public_key: {json.dumps(pem)}\n")
    with pytest.raises(ConfigError, match=r"keys\[0\].public_key: a .*, not an Ed25519 key"):
        load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(path)})
    path.write_text(public_keys_text([ISSUER.public(), ISSUER.public(["svc-console"])]))
    with pytest.raises(ConfigError, match=r"keys\[1\] is keys\[0\] again"):
        load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(path)})


def test_no_public_keys_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set QM_AUTH_PUBLIC_KEYS_FILE"):
        load_keys({})
    missing = tmp_path / "none.yaml"
    with pytest.raises(ConfigError, match=f"QM_AUTH_PUBLIC_KEYS_FILE {missing}: cannot read"):
        load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(missing)})


def test_a_signing_key_must_be_a_private_ed25519_key_for_its_owner_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set QM_AUTH_SIGNING_KEY_FILE"):
        load_signer({})

    def signer(path: Path) -> SigningKey:
        return load_signer({"QM_AUTH_SIGNING_KEY_FILE": str(path)})

    with pytest.raises(ConfigError, match="cannot read"):
        signer(tmp_path / "none.key")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        signer(write(tmp_path / "secret", "k" * 64 + "\n"))
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        signer(write(tmp_path / "public.pem", PEM))
    ecdsa = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(ConfigError, match="not an Ed25519 key"):
        signer(write(tmp_path / "ec.key", ecdsa.decode()))
    key = write(tmp_path / "issuer.key", ISSUER.pem().decode(), 0o644)
    with pytest.raises(ConfigError, match=r"every account may read .* chmod 600"):
        signer(key)
    key.chmod(0o640)  # its group may (Kubernetes: the pod's fsGroup)
    assert signer(key).kid == ISSUER.kid


def test_a_service_refuses_a_key_that_signs_for_others(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    keygen(folder)
    keys = load_keys({"QM_AUTH_PUBLIC_KEYS_FILE": str(folder / PUBLIC_KEYS)})

    def service_signer(key: str, subjects: tuple[str, ...]) -> SigningKey:
        env = {"QM_AUTH_SIGNING_KEY_FILE": str(folder / key)}
        return load_service_signer(keys, subjects, env)

    console = service_signer("console.key", ("svc-console",))
    assert verify_token(issue_token("svc-console", console), keys) == "svc-console"
    both = ("svc-admission", "svc-log-reader")
    assert service_signer("admission.key", both).kid != console.kid
    with pytest.raises(ConfigError, match=r"key issuer .* may sign tokens for anyone"):
        service_signer("issuer.key", ("svc-console",))
    with pytest.raises(ConfigError, match=r"svc-admission, svc-log-reader; .* svc-console only"):
        service_signer("admission.key", ("svc-console",))
    with pytest.raises(ConfigError, match="may not sign for svc-log-reader"):
        service_signer("console.key", ("svc-console", "svc-log-reader"))
    stranger = write(tmp_path / "stranger.key", SigningKey.generate().pem().decode())
    with pytest.raises(ConfigError, match="not in QM_AUTH_PUBLIC_KEYS_FILE"):
        load_service_signer(keys, ("svc-console",), {"QM_AUTH_SIGNING_KEY_FILE": str(stranger)})


def test_a_signing_key_never_shows_itself() -> None:
    assert ISSUER.private_key.private_bytes_raw().hex() not in repr(ISSUER)
    assert repr(ISSUER) == f"SigningKey(kid={ISSUER.kid!r}, issuer='quartermaster')"


def test_a_service_token_is_renewed_before_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    token = ServiceToken("svc-admission", ISSUER, ttl_s=600)
    first = token()
    clock[0] += 200
    assert token() == first
    clock[0] += 200  # past half its life
    renewed = token()
    assert renewed != first
    assert jwt.decode(renewed, options={"verify_signature": False})["exp"] == 1_000_400 + 600
