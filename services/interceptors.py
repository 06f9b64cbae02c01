"""The shape every server interceptor of ours shares: wrap each unary and each
async-streaming handler of a service in something of its own (others pass through)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Unary = Callable[..., Awaitable[Any]]
Stream = Callable[..., AsyncIterator[Any]]


class HandlerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Subclasses say how to wrap a unary handler and a server-streaming one."""

    def unary(self, method: str, inner: Unary) -> Unary:
        raise NotImplementedError

    def stream(self, method: str, inner: Stream) -> Stream:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            wrapped = self.unary(details.method, handler.unary_unary)
            return grpc.unary_unary_rpc_method_handler(wrapped, **serializers)
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            wrapped_stream = self.stream(details.method, handler.unary_stream)
            return grpc.unary_stream_rpc_method_handler(wrapped_stream, **serializers)
        return handler
