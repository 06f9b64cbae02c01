"""``qm login``: sign in (store a token where qm reads it); ``qm token issue``: a token
for anyone, for operators who hold the installation's signing key.

On the local stack both work as they are: without ``QM_AUTH_SECRET`` or
``QM_AUTH_SECRET_FILE``, the key is the one ``make up`` keeps in ``.local/auth-secret``
(in the current folder, the repository's root).
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
from libs.auth import Keys, issue_token, load_keys
from libs.auth.tokens import DEFAULT_TTL_S
from libs.config.document import ConfigError

token_app = group("Operator tools for tokens.")
LOCAL_SECRET = Path(".local") / "auth-secret"
TTL = Annotated[
    float, duration("12h", "How long the token is valid (e.g. 30m, 12h, 7d)", positive=True)
]


def _keys() -> Keys:
    env = dict(os.environ)
    if not (env.get("QM_AUTH_SECRET") or env.get("QM_AUTH_SECRET_FILE")):
        if not LOCAL_SECRET.is_file():
            raise ConfigError(
                "environment: no signing secret: set QM_AUTH_SECRET_FILE (or QM_AUTH_SECRET), "
                f"or run this where the local stack keeps its key ({LOCAL_SECRET})"
            )
        env["QM_AUTH_SECRET_FILE"] = str(LOCAL_SECRET)
    return load_keys(env)


@token_app.command("issue")
def token_issue(user: str, ttl: TTL = DEFAULT_TTL_S) -> None:
    """Print a token for USER, signed with this installation's key."""
    try:
        print(issue_token(user, _keys(), ttl_s=ttl))
    except ValueError as exc:  # a bad user name, or ConfigError: no usable key
        raise fail(exc) from exc


def login(
    user: Annotated[
        str | None, typer.Argument(help="Sign in as USER with this installation's key")
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
            text = issue_token(user or "", _keys(), ttl_s=ttl)
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
