"""Bearer tokens: JSON Web Tokens (PyJWT), signed by the installation or by an OIDC provider.

Installation tokens are HS256 JWTs with ``sub`` (the user), ``iss``, ``aud``, ``iat`` and
``exp``; the header's ``kid`` names the signing key. The keys are ``QM_AUTH_SECRET`` or
the file ``QM_AUTH_SECRET_FILE``, one secret per line: the first signs, every one
verifies. To rotate, put a new secret first and drop the old one once the tokens it
signed have expired. A secret shorter than 32 bytes, or a placeholder, stops a service
unless ``QM_AUTH_INSECURE_DEV=1`` says this is a throwaway installation.

With ``QM_OIDC_JWKS_URL`` set, tokens of that provider are accepted too (RS256 or
ES256, keys from its JWKS, ``QM_OIDC_ISSUER`` and ``QM_OIDC_AUDIENCE`` checked); the
user is the claim ``QM_OIDC_USER_CLAIM`` (default ``preferred_username``).

Tokens are carried as gRPC metadata ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from pydantic import Field

from libs.config.document import ConfigError
from libs.config.env import EnvSettings

DEFAULT_TTL_S = 12 * 3600.0
MIN_SECRET_BYTES = 32
_LEEWAY_S = 30  # clocks of the issuer and the service may differ a little
_PLACEHOLDER = re.compile(rb"replace|placeholder|changeme|example", re.IGNORECASE)
_REQUIRED = ["exp", "iat", "sub", "aud", "iss"]


class AuthError(Exception):
    """The caller could not be identified; the message says how to fix it."""


class AuthSettings(EnvSettings):
    secret: str | None = Field(None, alias="QM_AUTH_SECRET", repr=False)
    secret_file: Path | None = Field(None, alias="QM_AUTH_SECRET_FILE")
    issuer: str = Field("quartermaster", min_length=1, alias="QM_AUTH_ISSUER")
    audience: str = Field("quartermaster", min_length=1, alias="QM_AUTH_AUDIENCE")
    insecure_dev: bool = Field(False, alias="QM_AUTH_INSECURE_DEV")
    oidc_jwks_url: str | None = Field(None, alias="QM_OIDC_JWKS_URL")
    oidc_issuer: str | None = Field(None, alias="QM_OIDC_ISSUER")
    oidc_audience: str | None = Field(None, alias="QM_OIDC_AUDIENCE")
    oidc_user_claim: str = Field("preferred_username", min_length=1, alias="QM_OIDC_USER_CLAIM")


def key_id(secret: bytes) -> str:
    """A name for a key that says nothing about it (a prefix of its SHA-256)."""
    return hashlib.sha256(secret).hexdigest()[:16]


@dataclass(frozen=True)
class Keys:
    """The installation's signing keys: ``secrets[0]`` signs, every one verifies."""

    secrets: tuple[bytes, ...]
    issuer: str = "quartermaster"
    audience: str = "quartermaster"
    oidc: Oidc | None = None

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("at least one signing secret is needed")

    def by_id(self, kid: object) -> bytes | None:
        return next((s for s in self.secrets if key_id(s) == kid), None)


class Oidc:
    """An OpenID Connect provider whose tokens are accepted (keys from its JWKS)."""

    def __init__(
        self,
        jwks_url: str,
        issuer: str | None,
        audience: str | None,
        user_claim: str = "preferred_username",
    ) -> None:
        self.issuer, self.audience, self.user_claim = issuer, audience, user_claim
        # Caches the provider's keys for 5 minutes; a fetch blocks the caller briefly.
        self._jwks = jwt.PyJWKClient(jwks_url, lifespan=300, timeout=5)

    def user(self, token: str) -> str:
        try:
            key = self._jwks.get_signing_key_from_jwt(token)
        except jwt.PyJWKClientError as exc:
            raise AuthError(f"token: no key of the identity provider matches: {exc}") from None
        claims = _decode(
            token, key.key, ["RS256", "ES256"], issuer=self.issuer, audience=self.audience
        )
        user = claims.get(self.user_claim)
        if not isinstance(user, str) or not user:
            raise AuthError(f"token: the identity provider's token has no {self.user_claim!r}")
        return user


def load_keys(environ: dict[str, str] | None = None) -> Keys:
    """The installation's keys (and OIDC provider) from the environment; a ``ConfigError``
    when no secret is set, or one is short or a placeholder outside a dev installation."""
    settings = AuthSettings.from_env(environ)
    if settings.secret:
        secrets = [settings.secret.encode()]
    elif settings.secret_file is not None:
        secrets = _read_secrets(settings.secret_file)
    else:
        raise ConfigError(
            "environment: no signing secret: set QM_AUTH_SECRET_FILE (or QM_AUTH_SECRET)"
        )
    if not settings.insecure_dev:
        for position, secret in enumerate(secrets, 1):
            _check_strength(secret, position)
    oidc = (
        Oidc(
            settings.oidc_jwks_url,
            settings.oidc_issuer,
            settings.oidc_audience,
            settings.oidc_user_claim,
        )
        if settings.oidc_jwks_url
        else None
    )
    return Keys(tuple(secrets), settings.issuer, settings.audience, oidc)


def _read_secrets(path: Path) -> list[bytes]:
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"QM_AUTH_SECRET_FILE {path}: cannot read: {exc.strerror}") from None
    secrets = [line.strip() for line in lines if line.strip()]
    if not secrets:
        raise ConfigError(f"QM_AUTH_SECRET_FILE {path}: the file is empty")
    return secrets


def _check_strength(secret: bytes, position: int) -> None:
    where = f"signing secret {position}"
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"environment: {where} is {len(secret)} bytes, fewer than {MIN_SECRET_BYTES}: "
            "generate one with `openssl rand -hex 32` (QM_AUTH_INSECURE_DEV=1 allows it "
            "on a throwaway installation)"
        )
    if _PLACEHOLDER.search(secret):
        raise ConfigError(
            f"environment: {where} looks like a placeholder: generate one with "
            "`openssl rand -hex 32` (QM_AUTH_INSECURE_DEV=1 allows it on a throwaway "
            "installation)"
        )


def _check_user(user: str) -> str:
    if not user or user != user.strip() or any(c.isspace() or not c.isprintable() for c in user):
        raise ValueError(f"invalid user name {user!r}: no spaces or control characters")
    return user


def issue_token(
    user: str, keys: Keys, *, ttl_s: float = DEFAULT_TTL_S, now: float | None = None
) -> str:
    """A token for ``user``, valid for ``ttl_s`` seconds from ``now``."""
    if not ttl_s > 0:
        raise ValueError(f"a token's lifetime must be > 0 seconds, got {ttl_s:g}")
    issued = time.time() if now is None else now
    claims = {
        "sub": _check_user(user),
        "iss": keys.issuer,
        "aud": keys.audience,
        "iat": int(issued),
        "exp": int(issued + ttl_s),
    }
    secret = keys.secrets[0]
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": key_id(secret)})


def verify_token(token: str, keys: Keys) -> str:
    """The user a token names, if it is valid: signed by a key of this installation (or
    its identity provider), for this audience and issuer, and not expired."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        raise AuthError("malformed token: not a JWT; get a new one with `qm login`") from None
    algorithm = header.get("alg")
    if algorithm == "HS256":
        secret = keys.by_id(header.get("kid"))
        if secret is None:
            raise AuthError(
                "token signed with a key this installation does not know (another "
                "installation, or a rotated key): get a new one with `qm login`"
            )
        claims = _decode(token, secret, ["HS256"], issuer=keys.issuer, audience=keys.audience)
        return _token_user(claims.get("sub"))
    if keys.oidc is not None and algorithm in ("RS256", "ES256"):
        return keys.oidc.user(token)
    raise AuthError(f"token signed with {algorithm!r}, which this installation does not accept")


def _token_user(user: object) -> str:
    if not isinstance(user, str):
        raise AuthError("token: no user (sub)")
    try:
        return _check_user(user)
    except ValueError as exc:
        raise AuthError(f"token: {exc}") from None


def _decode(
    token: str, key: Any, algorithms: list[str], *, issuer: str | None, audience: str | None
) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=algorithms,
            issuer=issuer,
            audience=audience,
            leeway=_LEEWAY_S,
            options={"require": _REQUIRED if audience else _REQUIRED[:3]},
        )
    except jwt.ExpiredSignatureError:
        raise AuthError("token expired: get a new one with `qm login`") from None
    except jwt.InvalidAudienceError:
        raise AuthError(f"token is for another audience, not {audience!r}") from None
    except jwt.InvalidIssuerError:
        raise AuthError(f"token was issued by another issuer, not {issuer!r}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(f"token lacks the {exc.claim!r} claim") from None
    except jwt.InvalidSignatureError:
        raise AuthError("token signature does not match: get a new one with `qm login`") from None
    except jwt.InvalidTokenError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    return claims


class ServiceToken:
    """A service's own token for calling another service, issued anew before it expires."""

    def __init__(self, user: str, keys: Keys, *, ttl_s: float = 600.0) -> None:
        self._user, self._keys, self._ttl_s = user, keys, ttl_s
        self._token, self._renew_at = "", 0.0

    def __call__(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._token = issue_token(self._user, self._keys, ttl_s=self._ttl_s, now=now)
            self._renew_at = now + self._ttl_s / 2
        return self._token
