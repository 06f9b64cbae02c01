"""How a failure inside a service reaches a gRPC caller: a status a client can act on.

A dependency that cannot answer now (the broker, the projector, the budget service)
is UNAVAILABLE, which clients retry; anything else that escapes a servicer is a
defect, logged with its traceback and answered INTERNAL. Never UNKNOWN, the status
grpc gives an exception it was not told about.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiokafka.errors import KafkaError

from services.interceptors import HandlerInterceptor, Stream, Unary

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """A service this one depends on cannot answer now; the message says which."""


async def bounded(context: grpc.aio.ServicerContext, field: str, value: str, most: int) -> None:
    """A request's id or name no longer than any the system keeps, or INVALID_ARGUMENT."""
    if len(value) > most:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"{field}: must be at most {most} characters"
        )


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    # Imported here: the projector client pulls in aiohttp, which not every service loads.
    from services.projector.client import ProjectorError

    if isinstance(exc, Unavailable | ProjectorError):
        return grpc.StatusCode.UNAVAILABLE, f"{exc}; try again shortly"
    if isinstance(exc, KafkaError | TimeoutError):
        return grpc.StatusCode.UNAVAILABLE, (
            f"the event log (Kafka) did not answer in time ({type(exc).__name__}); try again"
        )
    log.error("internal error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the service log"


class StatusInterceptor(HandlerInterceptor):
    """Turns what escapes a handler into ``status_of``'s status."""

    def unary(self, method: str, inner: Unary) -> Unary:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await inner(request, context)
            except grpc.aio.AbortError:  # aborted on purpose: that status stands
                raise
            except Exception as exc:
                await context.abort(*status_of(exc))

        return unary

    def stream(self, method: str, inner: Stream) -> Stream:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in inner(request, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await context.abort(*status_of(exc))

        return stream
