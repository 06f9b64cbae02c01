"""Tokens of an OpenID Connect provider: checked against the keys its JWKS endpoint
serves (a real HTTP server here), its issuer and the audience; the user is a claim."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from libs.auth import AuthError, Keys, SigningKey, issue_token, verify_token
from libs.auth.keygen import PUBLIC_KEYS, keygen
from libs.auth.tokens import Oidc, load_keys

PROVIDER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
IMPOSTOR = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ISSUER = "https://login.example.org"
INSTALLATION = SigningKey.generate()


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(PROVIDER.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "provider-1", "use": "sig"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/jwks"
    server.shutdown()


def provider_token(key: rsa.RSAPrivateKey = PROVIDER, **changes: object) -> str:
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": "00u1", "preferred_username": "alice", "iss": ISSUER, "aud": "qm-cli",
        "iat": now, "exp": now + 600,
    }  # fmt: skip
    claims.update(changes)
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "provider-1"})


def keys(jwks_url: str) -> Keys:
    return Keys((INSTALLATION.public(),), oidc=Oidc(jwks_url, ISSUER, "qm-cli"))


def test_a_providers_token_names_its_user(jwks_url: str) -> None:
    assert verify_token(provider_token(), keys(jwks_url)) == "alice"
    # The installation's own tokens are accepted beside them.
    assert verify_token(issue_token("bob", INSTALLATION), keys(jwks_url)) == "bob"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (lambda: provider_token(IMPOSTOR), "signature does not match"),
        (lambda: provider_token(aud="another-app"), "another audience"),
        (lambda: provider_token(iss="https://evil.example"), "another issuer"),
        (lambda: provider_token(exp=int(time.time()) - 3600), "expired"),
        (lambda: provider_token(preferred_username=None), "no 'preferred_username'"),
    ],
)
def test_a_bad_providers_token_is_refused(jwks_url: str, token: object, message: str) -> None:
    with pytest.raises(AuthError, match=message):
        verify_token(token(), keys(jwks_url))  # type: ignore[operator]


def test_without_a_provider_its_tokens_are_refused() -> None:
    with pytest.raises(AuthError, match="'RS256', which this installation does not accept"):
        verify_token(provider_token(), Keys.trusting(INSTALLATION))


def test_the_provider_is_configured_from_the_environment(jwks_url: str, tmp_path: Path) -> None:
    keygen(tmp_path)
    configured = load_keys(
        {
            "QM_AUTH_PUBLIC_KEYS_FILE": str(tmp_path / PUBLIC_KEYS),
            "QM_OIDC_JWKS_URL": jwks_url,
            "QM_OIDC_ISSUER": ISSUER,
            "QM_OIDC_AUDIENCE": "qm-cli",
            "QM_OIDC_USER_CLAIM": "sub",
        }
    )
    assert verify_token(provider_token(), configured) == "00u1"
