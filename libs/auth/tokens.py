"""Bearer tokens: JSON Web Tokens (PyJWT), signed by a key of the installation or by an
OIDC provider.

Installation tokens are EdDSA (Ed25519) JWTs with ``sub`` (the user), ``iss``, ``aud``,
``iat`` and ``exp``; the header's ``kid`` is the signing key's fingerprint (``key_id``).
Signing takes a private key and checking only public ones, so a service that checks
tokens cannot make them:

- ``QM_AUTH_PUBLIC_KEYS_FILE``: the keys every service checks tokens with (YAML; public,
  not a secret), each with the subjects (``sub``) it may sign tokens for, ``"*"`` for
  anyone::

      keys:
        - name: issuer                 # the user-token issuer: qm token, qm login
          subjects: "*"
          public_key: |
            -----BEGIN PUBLIC KEY-----
            MCowBQYDK2VwAyEA...
            -----END PUBLIC KEY-----
        - name: console                # the console's own key: its identity only
          subjects: [svc-console]
          public_key: ...

  A token is accepted when its ``kid`` names a key of the list, that key's signature
  matches, and the key may sign for its ``sub``. To rotate a key, list the new one
  too, sign with it, and drop the old one once the tokens it signed have expired.
- ``QM_AUTH_SIGNING_KEY_FILE``: one issuer's private key (PEM, PKCS#8; readable by its
  owner only). The operator's tooling (``cli/tokens.py``) holds the user-token
  issuer's; admission and the console each hold their own, which the list lets sign
  only their service identities (``SERVICE_SUBJECTS``): a service refuses to start
  with a key that may sign for anyone else. Nodes, the projector and the console hold
  no key that signs a user's token.

``python -m libs.auth keygen DIR`` makes them all (``libs.auth.keygen``).

With ``QM_OIDC_JWKS_URL`` set, tokens of that provider are accepted too (RS256 or
ES256, keys from its JWKS, ``QM_OIDC_ISSUER`` and ``QM_OIDC_AUDIENCE`` checked); the
user is the claim ``QM_OIDC_USER_CLAIM`` (default ``preferred_username``).

Tokens are carried as gRPC metadata ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import Field, field_validator

from libs.auth import keyfiles
from libs.auth.keyfiles import fingerprint, raw_public
from libs.config.document import ConfigError, FileModel, load
from libs.config.env import EnvSettings

DEFAULT_TTL_S = 12 * 3600.0
ALGORITHM = "EdDSA"
ANY = "*"
# The services that call others under an identity of their own, and the subjects their
# own keys may sign for (``python -m libs.auth keygen`` makes one key for each).
SERVICE_SUBJECTS: dict[str, tuple[str, ...]] = {
    "admission": ("svc-admission", "svc-log-reader"),
    "console": ("svc-console",),
}
_LEEWAY_S = 30  # clocks of the issuer and the service may differ a little
_REQUIRED = ["exp", "iat", "sub", "aud", "iss"]
KEYGEN_HINT = "`python -m libs.auth keygen DIR` makes the installation's keys"


class AuthError(Exception):
    """The caller could not be identified; the message says how to fix it."""


class AuthSettings(EnvSettings):
    public_keys_file: Path | None = Field(None, alias="QM_AUTH_PUBLIC_KEYS_FILE")
    signing_key_file: Path | None = Field(None, alias="QM_AUTH_SIGNING_KEY_FILE")
    issuer: str = Field("quartermaster", min_length=1, alias="QM_AUTH_ISSUER")
    audience: str = Field("quartermaster", min_length=1, alias="QM_AUTH_AUDIENCE")
    oidc_jwks_url: str | None = Field(None, alias="QM_OIDC_JWKS_URL")
    oidc_issuer: str | None = Field(None, alias="QM_OIDC_ISSUER")
    oidc_audience: str | None = Field(None, alias="QM_OIDC_AUDIENCE")
    oidc_user_claim: str = Field("preferred_username", min_length=1, alias="QM_OIDC_USER_CLAIM")


def key_id(public_key: Ed25519PublicKey) -> str:
    """A key's fingerprint (``keyfiles.fingerprint``): the ``kid``."""
    return fingerprint(raw_public(public_key))


@dataclass(frozen=True)
class PublicKey:
    """A key tokens are checked with, and the subjects it may sign for (None: anyone)."""

    key: Ed25519PublicKey
    subjects: frozenset[str] | None = None
    name: str = ""

    @property
    def kid(self) -> str:
        return key_id(self.key)

    def may_sign(self, subject: str) -> bool:
        return self.subjects is None or subject in self.subjects

    def pem(self) -> str:
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def __str__(self) -> str:
        return f"key {self.name} ({self.kid})" if self.name else f"key {self.kid}"


@dataclass(frozen=True)
class SigningKey:
    """A private key that signs tokens, and the issuer and audience they name."""

    private_key: Ed25519PrivateKey
    issuer: str = "quartermaster"
    audience: str = "quartermaster"

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def kid(self) -> str:
        return key_id(self.private_key.public_key())

    def public(self, subjects: Iterable[str] | None = None, name: str = "") -> PublicKey:
        """The key that checks this one's tokens, for ``subjects`` (None: anyone)."""
        allowed = None if subjects is None else frozenset(subjects)
        return PublicKey(self.private_key.public_key(), allowed, name)

    def pem(self) -> bytes:
        return keyfiles.private_pem(self.private_key)

    def __repr__(self) -> str:  # never the key itself
        return f"SigningKey(kid={self.kid!r}, issuer={self.issuer!r})"


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


@dataclass(frozen=True)
class Keys:
    """What tokens are checked with: the installation's public keys (each verifies, for
    the subjects it may sign), and an identity provider's."""

    public: tuple[PublicKey, ...]
    issuer: str = "quartermaster"
    audience: str = "quartermaster"
    oidc: Oidc | None = None

    def __post_init__(self) -> None:
        if not self.public:
            raise ValueError("at least one public key is needed")
        kids = [key.kid for key in self.public]
        if len(set(kids)) != len(kids):
            raise ValueError("a public key is listed twice")

    @classmethod
    def trusting(cls, *signers: SigningKey, subjects: Iterable[str] | None = None) -> Keys:
        """Keys that accept the tokens of ``signers``, for ``subjects`` (None: anyone)."""
        allowed = None if subjects is None else tuple(subjects)
        return cls(tuple(signer.public(allowed) for signer in signers))

    def by_id(self, kid: object) -> PublicKey | None:
        return next((key for key in self.public if key.kid == kid), None)


# --- the files ------------------------------------------------------------------------


Subject = Annotated[str, Field(min_length=1)]


class PublicKeyEntry(FileModel):
    name: str = ""
    # "*" (anyone) or the list of subjects; None stands for "*" once read.
    subjects: list[Subject] | None = Field(min_length=1)
    public_key: str = Field(min_length=1)

    @field_validator("subjects", mode="before")
    @classmethod
    def _any(cls, value: object) -> object:
        if value == ANY:
            return None
        if not isinstance(value, list):
            raise ValueError(f'expected "*" (anyone) or a list of subjects, got {value!r}')
        return value


class PublicKeysFile(FileModel):
    keys: list[PublicKeyEntry] = Field(min_length=1)


def read_public_keys(path: Path) -> tuple[PublicKey, ...]:
    """The keys of a public keys file, in its order; a ``ConfigError`` naming what is
    wrong with it."""
    where = f"QM_AUTH_PUBLIC_KEYS_FILE {path}"
    try:
        document = load(PublicKeysFile, path)
    except ConfigError as exc:
        raise ConfigError(f"QM_AUTH_PUBLIC_KEYS_FILE {exc} ({KEYGEN_HINT})") from None
    keys: list[PublicKey] = []
    for position, entry in enumerate(document.keys):
        try:
            key = serialization.load_pem_public_key(entry.public_key.encode())
        except ValueError:
            raise ConfigError(
                f"{where}: keys[{position}].public_key: not a PEM public key "
                "(-----BEGIN PUBLIC KEY-----)"
            ) from None
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigError(
                f"{where}: keys[{position}].public_key: a {type(key).__name__}, not an "
                f"Ed25519 key ({KEYGEN_HINT})"
            )
        subjects = None if entry.subjects is None else frozenset(entry.subjects)
        public = PublicKey(key, subjects, entry.name)
        same = next((n for n, k in enumerate(keys) if k.kid == public.kid), None)
        if same is not None:
            raise ConfigError(f"{where}: keys[{position}] is keys[{same}] again")
        keys.append(public)
    return tuple(keys)


def read_private_key(path: Path, where: str = "QM_AUTH_SIGNING_KEY_FILE") -> Ed25519PrivateKey:
    """A token signing key (``keyfiles.read_private_key``)."""
    return keyfiles.read_private_key(path, where, KEYGEN_HINT)


def _oidc(settings: AuthSettings) -> Oidc | None:
    if not settings.oidc_jwks_url:
        return None
    return Oidc(
        settings.oidc_jwks_url,
        settings.oidc_issuer,
        settings.oidc_audience,
        settings.oidc_user_claim,
    )


def load_keys(environ: dict[str, str] | None = None) -> Keys:
    """The keys tokens are checked with (and the OIDC provider), from the environment; a
    ``ConfigError`` when no public keys file is set, or it cannot be read or used."""
    settings = AuthSettings.from_env(environ)
    if settings.public_keys_file is None:
        raise ConfigError(
            "environment: no keys to check tokens with: set QM_AUTH_PUBLIC_KEYS_FILE to the "
            f"installation's public keys file ({KEYGEN_HINT}, with DIR/public-keys.yaml)"
        )
    public = read_public_keys(settings.public_keys_file)
    return Keys(public, settings.issuer, settings.audience, _oidc(settings))


def load_signer(environ: dict[str, str] | None = None) -> SigningKey:
    """The private key this process signs tokens with (``QM_AUTH_SIGNING_KEY_FILE``)."""
    settings = AuthSettings.from_env(environ)
    if settings.signing_key_file is None:
        raise ConfigError(
            "environment: no key to sign tokens with: set QM_AUTH_SIGNING_KEY_FILE to a "
            f"private key ({KEYGEN_HINT})"
        )
    private = read_private_key(settings.signing_key_file)
    return SigningKey(private, settings.issuer, settings.audience)


def load_service_signer(
    keys: Keys, subjects: Collection[str], environ: dict[str, str] | None = None
) -> SigningKey:
    """The private key of a service that signs its own tokens for ``subjects`` (its own
    identities): refused unless ``keys`` let it sign for exactly those, so that the
    service holds no key that signs anyone else's (a user's, an operator's) token."""
    signer = load_signer(environ)
    path = AuthSettings.from_env(environ).signing_key_file
    where = f"QM_AUTH_SIGNING_KEY_FILE {path}"
    own = frozenset(subjects)
    listed = keys.by_id(signer.kid)
    if listed is None:
        raise ConfigError(
            f"{where}: its public key ({signer.kid}) is not in QM_AUTH_PUBLIC_KEYS_FILE, "
            f"so no service accepts its tokens ({KEYGEN_HINT} and lists them)"
        )
    if listed.subjects is None or not listed.subjects <= own:
        others = "anyone" if listed.subjects is None else ", ".join(sorted(listed.subjects - own))
        raise ConfigError(
            f"{where}: {listed} may sign tokens for {others}; this service may hold a key "
            f"for {', '.join(sorted(own))} only: give it a key of its own ({KEYGEN_HINT})"
        )
    if missing := own - listed.subjects:
        raise ConfigError(
            f"{where}: {listed} may not sign for {', '.join(sorted(missing))}, which this "
            f"service needs: list those subjects with it in QM_AUTH_PUBLIC_KEYS_FILE"
        )
    return signer


# --- tokens ---------------------------------------------------------------------------


def _check_user(user: str) -> str:
    if not user or user != user.strip() or any(c.isspace() or not c.isprintable() for c in user):
        raise ValueError(f"invalid user name {user!r}: no spaces or control characters")
    return user


def issue_token(
    user: str, signer: SigningKey, *, ttl_s: float = DEFAULT_TTL_S, now: float | None = None
) -> str:
    """A token for ``user`` signed by ``signer``, valid for ``ttl_s`` seconds from ``now``."""
    if not ttl_s > 0:
        raise ValueError(f"a token's lifetime must be > 0 seconds, got {ttl_s:g}")
    issued = time.time() if now is None else now
    claims = {
        "sub": _check_user(user),
        "iss": signer.issuer,
        "aud": signer.audience,
        "iat": int(issued),
        "exp": int(issued + ttl_s),
    }
    return jwt.encode(claims, signer.private_key, algorithm=ALGORITHM, headers={"kid": signer.kid})


def verify_token(token: str, keys: Keys) -> str:
    """The user a token names, if it is valid: signed by a key of this installation that
    may sign for that user (or by its identity provider), for this audience and issuer,
    and not expired."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        raise AuthError("malformed token: not a JWT; get a new one with `qm login`") from None
    algorithm = header.get("alg")
    if algorithm == ALGORITHM:
        key = keys.by_id(header.get("kid"))
        if key is None:
            raise AuthError(
                "token signed with a key this installation does not know (another "
                "installation, or a rotated key): get a new one with `qm login`"
            )
        claims = _decode(token, key.key, [ALGORITHM], issuer=keys.issuer, audience=keys.audience)
        user = _token_user(claims.get("sub"))
        if not key.may_sign(user):
            raise AuthError(f"token for {user!r} signed with {key}, which may not sign for it")
        return user
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

    def __init__(self, user: str, signer: SigningKey, *, ttl_s: float = 600.0) -> None:
        self._user, self._signer, self._ttl_s = user, signer, ttl_s
        self._token, self._renew_at = "", 0.0

    def __call__(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._token = issue_token(self._user, self._signer, ttl_s=self._ttl_s, now=now)
            self._renew_at = now + self._ttl_s / 2
        return self._token
