"""Who is signed in: the CLI's token (``qm token issue``), kept in a cookie.

The cookie holds the token itself, HttpOnly (no script reads it), SameSite=Strict (no
other site's page sends it) and Secure when the console is reached over TLS; it is
verified again on every request, so an expired or re-keyed token signs the user out.
Signing in and out are the only POSTs, and they must come from the console's own pages
(the browser's ``Origin``), so another site cannot sign a visitor in as someone else.
"""

from __future__ import annotations

from aiohttp import web

from libs.auth import AuthError, Keys, verify_token

COOKIE = "qm_console_token"
MAX_TOKEN_CHARS = 8192  # a JWT of the CLI's is a few hundred; a cookie must stay under 4 KiB


class SignInError(Exception):
    """The token offered cannot sign anyone in; the message says why."""


def user_of(request: web.Request, keys: Keys) -> str | None:
    """The user the request's cookie names, if its token still verifies."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        return verify_token(token, keys)
    except AuthError:
        return None


def check_token(token: str, keys: Keys) -> str:
    """The user a pasted token signs in; ``SignInError`` says what is wrong with it."""
    token = token.strip()
    if not token:
        raise SignInError("paste a token: `qm token issue` prints one")
    if len(token) > MAX_TOKEN_CHARS:
        raise SignInError(f"that is not a token: longer than {MAX_TOKEN_CHARS} characters")
    try:
        return verify_token(token, keys)
    except AuthError as exc:
        raise SignInError(f"that token does not sign in: {exc}") from exc


def same_origin(request: web.Request) -> bool:
    """Whether a POST comes from a page of this console: browsers send ``Origin`` with
    every POST, and ``Sec-Fetch-Site`` where they support it."""
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == f"{request.scheme}://{request.host}"
    return request.headers.get("Sec-Fetch-Site") == "same-origin"


def keep(response: web.StreamResponse, token: str, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE, token.strip(), httponly=True, samesite="Strict", secure=secure, path="/"
    )


def forget(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/")
