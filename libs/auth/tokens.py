"""HMAC-signed bearer tokens: ``qm1.<user, base64url>.<signature, hex>``.

One secret per installation (``QM_AUTH_SECRET`` or the file named by
``QM_AUTH_SECRET_FILE``) signs tokens for people and for services. Tokens are
carried as gRPC metadata ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from pathlib import Path

from libs.config.document import ConfigError

_PREFIX = "qm1"


class AuthError(Exception):
    """The caller could not be identified; the message says how to fix it."""


def load_secret() -> bytes:
    """The installation's secret; a ``ConfigError`` when it is not set or cannot be read."""
    if secret := os.environ.get("QM_AUTH_SECRET"):
        return secret.encode()
    if path := os.environ.get("QM_AUTH_SECRET_FILE"):
        try:
            secret_bytes = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"QM_AUTH_SECRET_FILE {path}: cannot read: {exc.strerror}") from None
        if not secret_bytes:
            raise ConfigError(f"QM_AUTH_SECRET_FILE {path}: the file is empty")
        return secret_bytes
    raise ConfigError("environment: no signing secret: set QM_AUTH_SECRET or QM_AUTH_SECRET_FILE")


def issue_token(user: str, secret: bytes) -> str:
    if not user or "." in user:
        raise ValueError(f"invalid user name {user!r}")
    encoded = base64.urlsafe_b64encode(user.encode()).decode().rstrip("=")
    return f"{_PREFIX}.{encoded}.{_sign(encoded, secret)}"


def verify_token(token: str, secret: bytes) -> str:
    """The user a token names, if its signature is good."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != _PREFIX:
        raise AuthError("malformed token: expected qm1.<user>.<signature>")
    _, encoded, signature = parts
    if not hmac.compare_digest(signature, _sign(encoded, secret)):
        raise AuthError("token signature does not match this installation; get a new token")
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise AuthError("malformed token: bad user field") from exc


def _sign(encoded_user: str, secret: bytes) -> str:
    return hmac.new(secret, f"{_PREFIX}.{encoded_user}".encode(), hashlib.sha256).hexdigest()
