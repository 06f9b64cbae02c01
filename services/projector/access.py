"""Only Quartermaster's services read the projector's views: its answers hold every job's
command and environment, which users may see only through admission's checks.

Every path but ``/ready`` and ``/config`` (probes) wants ``Authorization: Bearer`` with a
token signed with the installation's keys, of a client named in ``QM_PROJECTOR_CLIENTS``
(default ``svc-admission,svc-console``); ``/metrics``, of one named in
``QM_METRICS_CLIENTS`` (``services.metrics_http``). Until ``allow`` is called, every such
request is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from libs.auth import Keys
from services.metrics_http import METRICS, METRICS_READERS, denial
from services.projector.contract import CONFIG, READY

_OPEN = frozenset({READY, CONFIG})
_allowed: tuple[Keys, frozenset[str], frozenset[str]] | None = None


def allow(keys: Keys, clients: frozenset[str], metrics_clients: frozenset[str]) -> None:
    """Accept tokens signed with ``keys`` naming one of ``clients`` (the views) or of
    ``metrics_clients`` (``/metrics``)."""
    global _allowed
    _allowed = (keys, clients, metrics_clients)


@web.middleware
async def require_client(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path in _OPEN:
        return await handler(request)
    if _allowed is None:
        return web.Response(status=503, text="the projector has no keys to check callers with")
    keys, clients, metrics_clients = _allowed
    header = request.headers.get("Authorization", "")
    if request.path == METRICS:
        refused = denial(header, keys, metrics_clients, METRICS_READERS)
    else:
        refused = denial(header, keys, clients, "the projector's views")
    return refused or await handler(request)
