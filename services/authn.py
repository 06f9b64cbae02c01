"""Who is calling: every RPC of every service starts here."""

from __future__ import annotations

import grpc

from libs.auth import AuthError, Keys, verify_token


async def caller(context: grpc.aio.ServicerContext, keys: Keys) -> str:
    """The authenticated user, or abort the call with UNAUTHENTICATED."""
    metadata = dict(context.invocation_metadata() or ())
    header = str(metadata.get("authorization", ""))
    if not header.startswith("Bearer "):
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing 'authorization: Bearer <token>' metadata (qm reads $QM_TOKEN "
            "or ~/.config/qm/token)",
        )
    try:
        return verify_token(header.removeprefix("Bearer ").strip(), keys)
    except AuthError as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    raise AssertionError("unreachable: abort raises")
