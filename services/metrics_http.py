"""Every service's HTTP side door: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` (200 while the process's event loop answers) and ``/readyz`` (200 once the
service says it is ready, else 503) are open, for probes. ``/metrics`` is Prometheus'
text format and wants ``Authorization: Bearer`` with a token signed with a key of the
installation's (``QM_AUTH_PUBLIC_KEYS_FILE``) that names a client in ``QM_METRICS_CLIENTS``
(default ``svc-prometheus``): metrics name allocations and nodes. The projector serves
``/metrics`` on its own web server (``services.projector.metrics``).

Settings: ``QM_METRICS_HOST`` (default 127.0.0.1), ``QM_METRICS_PORT`` (each service
has its own default, ``DEFAULT_PORTS``; 0 picks a free one), ``QM_METRICS_CLIENTS``.
Placement, the ticker and node agents check no other tokens: without the public keys
(``metrics_keys``) their ``/metrics`` answers 503 and their probes still work. No request
is logged: probes and scrapes come every few seconds, and aiohttp's own access log would
write each request's query and ``Referer`` (``services.access_log`` says what a server of
ours may log).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import Field

from libs.auth import AuthError, Keys, load_keys, verify_token
from libs.auth.tokens import AuthSettings
from libs.config.env import EnvSettings, Names

log = logging.getLogger(__name__)

DEFAULT_PORTS = {
    "admission": 9460,
    "budget": 9461,
    "placement": 9462,
    "ticker": 9463,
    "node_agent": 9464,
}
HEALTHZ, READYZ, METRICS = "/healthz", "/readyz", "/metrics"


class MetricsSettings(EnvSettings):
    host: str = Field("127.0.0.1", min_length=1, alias="QM_METRICS_HOST")
    port: int | None = Field(None, ge=0, le=65535, alias="QM_METRICS_PORT")
    clients: Names = Field(("svc-prometheus",), alias="QM_METRICS_CLIENTS")


def denial(header: str, keys: Keys, clients: frozenset[str], what: str) -> web.Response | None:
    """Why a request with this ``Authorization`` header may not read ``what``, as the
    response to give; None when it may: its token is valid and names one of ``clients``."""
    if not header.startswith("Bearer "):
        return web.Response(status=401, text="missing 'Authorization: Bearer <token>'")
    try:
        user = verify_token(header.removeprefix("Bearer ").strip(), keys)
    except AuthError as exc:
        return web.Response(status=401, text=str(exc))
    if user not in clients:
        return web.Response(status=403, text=f"{user} may not read {what}")
    return None


METRICS_READERS = "metrics (QM_METRICS_CLIENTS names who may)"


def metrics_response() -> web.Response:
    body = generate_latest(REGISTRY)
    # aiohttp wants the charset apart from the content type.
    content_type, _, charset = CONTENT_TYPE_LATEST.partition("; charset=")
    return web.Response(body=body, content_type=content_type, charset=charset or None)


def metrics_keys() -> Keys | None:
    """The installation's keys for a service that needs them only for ``/metrics``: None
    when no public keys file is set (a set but unreadable one is still a ``ConfigError``)."""
    if AuthSettings.from_env().public_keys_file is not None:
        return load_keys()
    log.warning("no QM_AUTH_PUBLIC_KEYS_FILE: /metrics answers 503 until one is set")
    return None


def metrics_app(
    ready: Callable[[], bool], keys: Keys | None, clients: frozenset[str]
) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="alive")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ready") if ready() else web.Response(status=503, text="starting")

    async def metrics(request: web.Request) -> web.Response:
        if keys is None:
            return web.Response(status=503, text="no public keys to check tokens with")
        refused = denial(request.headers.get("Authorization", ""), keys, clients, METRICS_READERS)
        return refused or metrics_response()

    app = web.Application()
    app.router.add_get(HEALTHZ, healthz)
    app.router.add_get(READYZ, readyz)
    app.router.add_get(METRICS, metrics)
    return app


@asynccontextmanager
async def metrics_server(
    service: str,
    keys: Keys | None,
    ready: Callable[[], bool],
    settings: MetricsSettings | None = None,
) -> AsyncIterator[int]:
    """Serve ``/healthz``, ``/readyz`` (``ready()``) and ``/metrics`` while inside; yields
    the bound port."""
    own = settings or MetricsSettings.from_env()
    port = DEFAULT_PORTS[service] if own.port is None else own.port
    runner = web.AppRunner(metrics_app(ready, keys, frozenset(own.clients)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, own.host, port)
        await site.start()
        bound = runner.addresses[0][1]
        log.info("metrics, health and readiness on http://%s:%d", own.host, bound)
        yield bound
    finally:
        await runner.cleanup()
