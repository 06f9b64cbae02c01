"""``qm login``: sign in (store a token where qm reads it); ``qm token issue``: a token
for anyone, for operators who hold the installation's user-token issuer key.

That key is ``QM_AUTH_SIGNING_KEY_FILE`` (``issuer.key`` of ``python -m libs.auth keygen``;
``libs.auth.tokens``). On the local stack both work as they are: without it, the key is
the one ``make up`` keeps in ``.local/auth/issuer.key`` (in the current folder, the
repository's root).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import jwt
import typer

from cli.connection import TokenSettings
from cli.groups import group
from cli.params import duration
from cli.render import fail
from libs.auth import SigningKey, issue_token, load_signer
from libs.auth.keygen import described, keygen
from libs.auth.tokens import DEFAULT_TTL_S
from libs.config.document import ConfigError

token_app = group("Operator tools for tokens.")
LOCAL_KEY = Path(".local") / "auth" / "issuer.key"
TTL = Annotated[
    float, duration("12h", "How long the token is valid (e.g. 30m, 12h, 7d)", positive=True)
]


def _signer() -> SigningKey:
    env = dict(os.environ)
    if not env.get("QM_AUTH_SIGNING_KEY_FILE"):
        if not LOCAL_KEY.is_file():
            raise ConfigError(
                "environment: no key to sign tokens with: set QM_AUTH_SIGNING_KEY_FILE to the "
                "installation's user-token issuer key (issuer.key of `python -m libs.auth "
                f"keygen DIR`), or run this where the local stack keeps it ({LOCAL_KEY})"
            )
        env["QM_AUTH_SIGNING_KEY_FILE"] = str(LOCAL_KEY)
    return load_signer(env)


@token_app.command("issue")
def token_issue(user: str, ttl: TTL = DEFAULT_TTL_S) -> None:
    """Print a token for USER, signed with this installation's user-token issuer key."""
    try:
        print(issue_token(user, _signer(), ttl_s=ttl))
    except ValueError as exc:  # a bad user name, or ConfigError: no usable key
        raise fail(exc) from exc


@token_app.command("keygen")
def token_keygen(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Where to keep the keys")],
) -> None:
    """Make the installation's token keys in DIR (those there are kept): issuer.key for
    qm token and qm login, a key for each service that signs its own tokens, and
    public-keys.yaml, every service's QM_AUTH_PUBLIC_KEYS_FILE."""
    try:
        made = keygen(folder)
    except (ValueError, OSError) as exc:
        raise fail(exc) from exc
    print("\n".join(described(made)))


def login(
    user: Annotated[
        str | None, typer.Argument(help="Sign in as USER with this installation's issuer key")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Store this token (from your identity provider); '-': from stdin"),
    ] = None,
    ttl: TTL = DEFAULT_TTL_S,
) -> None:
    """Sign in: write a token to the file qm reads ($QM_TOKEN_FILE, ~/.config/qm/token)."""
    try:
        if (user is None) == (token is None):
            raise ValueError("name a USER to sign in as, or give --token")
        if token is not None:
            text = (sys.stdin.read() if token == "-" else token).strip()
        else:
            text = issue_token(user or "", _signer(), ttl_s=ttl)
        who, expires = _claims(text)
        path = TokenSettings.from_env().token_file
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(text + "\n")
        os.chmod(path, 0o600)  # an older file may have been readable by others
    except (ValueError, OSError) as exc:
        raise fail(exc) from exc
    until = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"signed in as {who} until {until} (token in {path})")


def _claims(token: str) -> tuple[str, float]:
    """Who a token names and when it expires, unchecked: only the services can check it."""
    try:
        claims: dict[str, object] = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError as exc:
        raise ValueError(f"not a token: {exc}") from None
    expires = claims.get("exp")
    if not isinstance(expires, int | float):
        raise ValueError("the token has no expiry (exp); Quartermaster accepts none without")
    return str(claims.get("preferred_username") or claims.get("sub", "?")), float(expires)
