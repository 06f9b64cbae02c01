"""Attacks on the wire: the gRPC services speak TLS with the local stack's certificates
(deploy/local/certs.py); a plain-text client, a client that trusts another CA and, under
mutual TLS, a client without a certificate are all refused, while a client trusting the
services' CA is answered. qm will not send a token in plain text to another host."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cli.connection import Connection
from libs.config.document import ConfigError
from services.grpc_server import start_server
from services.tls import TlsSettings, aio_channel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "local"))
from certs import make


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls")
    make(folder / "ours")
    make(folder / "theirs")  # another installation's CA
    return folder


def settings(folder: Path, *, ca: Path | None = None, client_auth: bool = False) -> TlsSettings:
    return TlsSettings.from_env(
        {
            "QM_TLS_CERT": str(folder / "server.crt"),
            "QM_TLS_KEY": str(folder / "server.key"),
            "QM_TLS_CA": str(ca or folder / "ca.crt"),
            **({"QM_TLS_CLIENT_AUTH": "1"} if client_auth else {}),
        }
    )


@pytest.fixture(params=[False, True], ids=["tls", "mutual-tls"])
async def server(request: pytest.FixtureRequest, certs: Path) -> AsyncIterator[tuple[str, bool]]:
    mutual: bool = request.param
    served, port = await start_server(
        "127.0.0.1:0", [], [], settings(certs / "ours", client_auth=mutual)
    )
    yield f"127.0.0.1:{port}", mutual
    await served.stop(grace=None)


async def check(target: str, tls: TlsSettings) -> bool:
    async with aio_channel(target, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def test_a_client_that_trusts_the_services_ca_is_answered(
    server: tuple[str, bool], certs: Path
) -> None:
    target, _ = server
    # the client shows the certificate it has (mutual TLS wants one)
    assert await check(target, settings(certs / "ours"))


async def test_plain_text_is_refused(server: tuple[str, bool]) -> None:
    target, _ = server
    assert not await check(target, TlsSettings.from_env({}))


async def test_a_client_that_trusts_another_ca_is_refused(
    server: tuple[str, bool], certs: Path
) -> None:
    """As a client that meets an impostor: it refuses to talk, so no token leaves it."""
    target, _ = server
    assert not await check(target, settings(certs / "theirs"))


async def test_under_mutual_tls_a_client_without_a_certificate_is_refused(
    server: tuple[str, bool], certs: Path
) -> None:
    target, mutual = server
    no_certificate = TlsSettings.from_env({"QM_TLS_CA": str(certs / "ours" / "ca.crt")})
    assert await check(target, no_certificate) is not mutual


def test_qm_sends_no_token_in_plain_text_to_another_host() -> None:
    remote = {"QM_ADDR": "10.1.2.3:50051", "QM_TOKEN": "t", "QM_TLS_CA": ""}
    with pytest.raises(ConfigError, match=r"10\.1\.2\.3:50051 is another host and no CA is set"):
        Connection.from_env(remote)
    assert Connection.from_env({**remote, "QM_PLAINTEXT": "1"}).admission.address
    assert Connection.from_env({**remote, "QM_ADDR": "127.0.0.1:50051"}).token == "t"


def test_tls_settings_name_what_is_missing(certs: Path) -> None:
    with pytest.raises(ConfigError, match="QM_TLS_CERT and QM_TLS_KEY together"):
        TlsSettings.from_env({"QM_TLS_CERT": str(certs / "ours" / "server.crt")})
    with pytest.raises(ConfigError, match=r"QM_TLS_CA /nowhere/ca\.crt: cannot read"):
        TlsSettings.from_env({"QM_TLS_CA": "/nowhere/ca.crt"})
