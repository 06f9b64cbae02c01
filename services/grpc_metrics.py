"""Counts every gRPC call a service answers, by method and final status
(``qm_grpc_requests_total``); placed outside ``StatusInterceptor`` so that the status
counted is the one the caller gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from libs.telemetry.metrics import GRPC_REQUESTS
from services.interceptors import HandlerInterceptor, Stream, Unary


class CountingInterceptor(HandlerInterceptor):
    def unary(self, method: str, inner: Unary) -> Unary:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            failed = True
            try:
                reply = await inner(request, context)
                failed = False
                return reply
            finally:
                _count(method, context, failed)

        return unary

    def stream(self, method: str, inner: Stream) -> Stream:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            failed = True
            try:
                async for item in inner(request, context):
                    yield item
                failed = False
            finally:
                _count(method, context, failed)

        return stream


def _count(method: str, context: grpc.aio.ServicerContext, failed: bool) -> None:
    code = context.code()
    if code is None:  # nothing set: OK, unless the handler raised past every interceptor
        name = "UNKNOWN" if failed else "OK"
    else:
        name = code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode(code).name
    GRPC_REQUESTS.labels(method, name).inc()
