"""The console's routes. Read-only: nothing here changes the cluster.

``GET /`` the page (``web/static/index.html``, one script and one stylesheet), ``GET
/api/view`` its data as JSON, ``GET /events`` the same as server-sent events whenever the
feed refreshes, ``GET /login`` and ``POST /login`` (a pasted token), ``POST /logout``;
``/healthz`` and ``/readyz`` for probes, ``/static/`` for assets.

A token is taken from a POST's body only: one in an address (``?token=``) would stay in
the browser's history, proxies' logs and ``Referer`` headers, so such a request signs no
one in and is answered with the sign-in form.

Every response forbids inline script and style, framing and other origins (``CSP``);
the page builds its DOM with ``textContent`` only, so nothing shown is read as markup.
"""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from string import Template
from typing import Any

from aiohttp import web
from aiohttp_sse import sse_response

from libs.auth import Keys
from libs.config.document import ConfigError
from libs.readmodels.dashboard import Json
from services.access_log import AccessLog
from services.console import session
from services.console.feed import Feed
from services.console.starts import StartEstimates
from services.status import Unavailable

WEB = Path(__file__).parent / "web"
STATIC = WEB / "static"
# npm ci (make install) puts the pinned chart library here (web/package-lock.json).
CHARTS = WEB / "node_modules" / "uplot" / "dist"
LOGIN = Template((WEB / "login.html").read_text())
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
KEEPALIVE_S = 15.0  # a stream re-checks its token and resends at least this often
# How the app is served (web.AppRunner's options): event streams stay open, so a stop
# gives them a moment, not aiohttp's minute; requests are logged without their query.
RUNNER_OPTIONS: dict[str, Any] = {"shutdown_timeout": 3.0, "access_log_class": AccessLog}
TOKEN_IN_ADDRESS = (
    "a token in the address signs no one in (it would stay in logs and the browser's "
    "history): paste it here"
)
_OPEN = frozenset({"/healthz", "/readyz", "/login", "/favicon.ico"})

FEED = web.AppKey("feed", Feed)
STARTS = web.AppKey("starts", StartEstimates)
KEYS = web.AppKey("keys", Keys)
SECURE = web.AppKey("secure", bool)
USER = web.RequestKey("user", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(feed: Feed, keys: Keys, starts: StartEstimates, *, secure: bool) -> web.Application:
    """``secure``: served over TLS, so the cookie is sent over TLS only; ``starts`` fills
    in the waiting jobs' estimated starts (from admission)."""
    if not (CHARTS / "uPlot.iife.min.js").is_file():
        raise ConfigError(
            f"{CHARTS}: the chart library is missing: run `make install` "
            "(npm ci in services/console/web)"
        )
    app = web.Application(middlewares=[_signed_in])
    app[FEED], app[KEYS], app[STARTS], app[SECURE] = feed, keys, starts, secure
    app.on_response_prepare.append(_headers)
    app.router.add_get("/", _page)
    app.router.add_get("/api/view", _view)
    app.router.add_get("/events", _events)
    app.router.add_get("/login", _login_page)
    app.router.add_post("/login", _login)
    app.router.add_post("/logout", _logout)
    # Browsers ask for it on any page without an icon of its own (a JSON answer).
    app.router.add_get("/favicon.ico", _favicon)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_static("/static/charts/", CHARTS)
    app.router.add_static("/static/", STATIC)
    return app


@web.middleware
async def _signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Everything but the probes, sign-in and assets wants a signed-in user; nothing
    answers a request with a token in its address but the refusal."""
    if "token" in request.query:
        return _login_form(TOKEN_IN_ADDRESS, status=400)
    if request.path in _OPEN or request.path.startswith("/static/"):
        return await handler(request)
    user = session.user_of(request, request.app[KEYS])
    if user is None:
        if request.path == "/":
            raise web.HTTPSeeOther("/login")
        return web.json_response({"error": "not signed in (or the token expired)"}, status=401)
    request[USER] = user
    return await handler(request)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"  # no-referrer would send Origin: null
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


async def _view(request: web.Request) -> web.Response:
    try:
        return web.json_response(await _user_view(request, request[USER]))
    except Unavailable as exc:
        return web.json_response({"error": str(exc)}, status=503)


async def _user_view(request: web.Request, user: str) -> Json:
    """The feed's picture as ``user`` may see it, with estimated starts asked of admission
    with the user's own token."""
    view = request.app[FEED].view(user)
    await request.app[STARTS].fill(view, request.cookies.get(session.COOKIE, ""))
    return view


async def _events(request: web.Request) -> web.StreamResponse:
    """The view, each time the feed refreshes, until the client leaves or the token
    stops verifying (then a ``signed-out`` event, and the page goes to the login)."""
    feed, keys = request.app[FEED], request.app[KEYS]
    async with sse_response(request) as stream:
        seen = 0
        while stream.is_connected():
            seen = await feed.changed(seen, KEEPALIVE_S)
            user = session.user_of(request, keys)
            if user is None:
                await stream.send("the token expired or no longer verifies", event="signed-out")
                break
            try:
                view = await _user_view(request, user)
            except Unavailable:
                continue
            await stream.send(json.dumps(view), event="view")
    return stream


async def _favicon(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/static/favicon.svg")


def _login_form(error: str = "", status: int = 200) -> web.Response:
    body = LOGIN.substitute(error=html.escape(error))
    return web.Response(text=body, content_type="text/html", status=status)


async def _login_page(request: web.Request) -> web.Response:
    return _login_form()


async def _login(request: web.Request) -> web.StreamResponse:
    if not session.same_origin(request):
        return _login_form("sign in from the console's own page", status=403)
    form = await request.post()
    token = form.get("token", "")
    token = token if isinstance(token, str) else ""
    try:
        session.check_token(token, request.app[KEYS])
    except session.SignInError as exc:
        return _login_form(str(exc), status=401)
    response = _see_other("/")
    session.keep(response, token, secure=request.app[SECURE] or request.secure)
    return response


async def _logout(request: web.Request) -> web.StreamResponse:
    if not session.same_origin(request):
        return web.Response(status=403, text="sign out from the console's own page")
    response = _see_other("/login")
    session.forget(response)
    return response


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    feed = request.app[FEED]
    if feed.ready:
        return web.Response(text="ready")
    return web.Response(status=503, text=f"not ready: {feed.problem}")
