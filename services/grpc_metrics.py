"""Counts every gRPC call a service answers, by method and final status
(``qm_grpc_requests_total``); placed outside ``StatusInterceptor`` so that the status
counted is the one the caller gets."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from libs.telemetry.metrics import GRPC_REQUESTS


class CountingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            return grpc.unary_stream_rpc_method_handler(
                _stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _count(method: str, context: grpc.aio.ServicerContext, failed: bool) -> None:
    code = context.code()
    if code is None:  # nothing set: OK, unless the handler raised past every interceptor
        name = "UNKNOWN" if failed else "OK"
    else:
        name = code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode(code).name
    GRPC_REQUESTS.labels(method, name).inc()


def _unary(method: str, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        failed = True
        try:
            reply = await inner(request, context)
            failed = False
            return reply
        finally:
            _count(method, context, failed)

    return unary


def _stream(
    method: str, inner: Callable[..., AsyncIterator[Any]]
) -> Callable[..., AsyncIterator[Any]]:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        failed = True
        try:
            async for item in inner(request, context):
                yield item
            failed = False
        finally:
            _count(method, context, failed)

    return stream
