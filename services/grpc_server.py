"""A gRPC server with the standard health service and server reflection, over TLS when
``QM_TLS_CERT``/``QM_TLS_KEY`` are set (``services.tls``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import health_check, negate

from services.grpc_metrics import CountingInterceptor
from services.status import StatusInterceptor
from services.tls import TlsSettings

log = logging.getLogger(__name__)

Registrar = Callable[[grpc.aio.Server], None]
# Calls under way when the service is told to stop get this long to finish.
STOP_GRACE_S = 2.0


async def start_server(
    address: str,
    registrars: Sequence[Registrar],
    service_names: Sequence[str],
    tls: TlsSettings | None = None,
    health_servicer: health.aio.HealthServicer | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start serving, with TLS if ``tls`` (default: the environment's) has a certificate;
    returns the server and the bound port (0 in ``address`` picks one). Every service is
    marked SERVING on ``health_servicer`` (default: a new one)."""
    credentials = (tls or TlsSettings.from_env()).server_credentials()
    # A server span per RPC (the instrumentation is untyped), but none for the health
    # service: the aio interceptor iterates a server-streaming handler with ``async for``
    # (opentelemetry-python-contrib#3066), and Health/Watch writes with ``context.write``
    # instead, so traced it fails at once; probes are no trace's business either.
    tracing = aio_server_interceptor(filter_=negate(health_check()))  # type: ignore[no-untyped-call]
    server = grpc.aio.server(interceptors=[tracing, CountingInterceptor(), StatusInterceptor()])
    for register in registrars:
        register(server)
    health_servicer = health_servicer or health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [
            *service_names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    await server.start()
    for name in ("", *service_names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port


async def serve_until_cancelled(
    address: str,
    registrars: Sequence[Registrar],
    service_names: Sequence[str],
    serving: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled (the process is told to stop), then stop: health watchers hear
    NOT_SERVING, and the calls under way get ``STOP_GRACE_S`` to finish. ``serving`` is
    set once calls are answered."""
    tls = TlsSettings.from_env()
    health_servicer = health.aio.HealthServicer()
    server, port = await start_server(address, registrars, service_names, tls, health_servicer)
    if serving is not None:
        serving.set()
    names = " and ".join(name.rsplit(".", 1)[-1] for name in service_names)
    how = "mutual TLS" if tls.client_auth else "TLS" if tls.enabled else "plain text"
    log.info("serving %s on port %d (%s)", names, port, how)
    try:
        await server.wait_for_termination()
    finally:
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=STOP_GRACE_S)


def bearer(token: str) -> tuple[tuple[str, Any], ...]:
    """Call metadata that authenticates as the holder of ``token``."""
    return (("authorization", f"Bearer {token}"),)
