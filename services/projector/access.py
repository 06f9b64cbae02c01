"""Only Quartermaster's services read the projector's views: its answers hold every job's
command and environment, which users may see only through admission's checks.

Every path but ``/ready`` and ``/config`` (probes) wants ``Authorization: Bearer`` with a
token of a client named in ``QM_PROJECTOR_CLIENTS`` (default ``svc-admission,svc-console``),
signed with the installation's keys; until ``allow`` is called, every such request is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from libs.auth import AuthError, Keys, verify_token
from services.projector.contract import CONFIG, READY

_OPEN = frozenset({READY, CONFIG})
_allowed: tuple[Keys, frozenset[str]] | None = None


def allow(keys: Keys, clients: frozenset[str]) -> None:
    """Accept tokens signed with ``keys`` naming one of ``clients``."""
    global _allowed
    _allowed = (keys, clients)


@web.middleware
async def require_client(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path in _OPEN:
        return await handler(request)
    if _allowed is None:
        return web.Response(status=503, text="the projector has no keys to check callers with")
    keys, clients = _allowed
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return web.Response(status=401, text="missing 'Authorization: Bearer <token>'")
    try:
        user = verify_token(header.removeprefix("Bearer ").strip(), keys)
    except AuthError as exc:
        return web.Response(status=401, text=str(exc))
    if user not in clients:
        return web.Response(status=403, text=f"{user} may not read the projector's views")
    return await handler(request)
