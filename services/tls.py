"""TLS on gRPC: a server's credentials, and a client's that verify the server (and, for
mutual TLS, show the client's own certificate).

``QM_TLS_CERT`` and ``QM_TLS_KEY``: this process's certificate chain and key (a server's;
a client's own under mutual TLS). ``QM_TLS_CA``: the CA that signed the servers'
certificates, which clients verify against; a server with ``QM_TLS_CLIENT_AUTH=require``
also wants every client to show a certificate that chains to it. The files are read at
start: a missing one stops the process with its name. ``make up`` makes a local CA and a
certificate for 127.0.0.1 and localhost (``deploy/local/certs.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import grpc
from pydantic import Field, PrivateAttr, model_validator

from libs.config.env import EnvSettings


class TlsSettings(EnvSettings):
    cert: Path | None = Field(None, alias="QM_TLS_CERT")
    key: Path | None = Field(None, alias="QM_TLS_KEY")
    ca: Path | None = Field(None, alias="QM_TLS_CA")
    client_auth: bool = Field(False, alias="QM_TLS_CLIENT_AUTH")
    _pem: dict[str, bytes] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _read(self) -> Self:
        if (self.cert is None) != (self.key is None):
            raise ValueError("set QM_TLS_CERT and QM_TLS_KEY together (a certificate and its key)")
        if self.client_auth and (self.ca is None or self.cert is None):
            raise ValueError(
                "QM_TLS_CLIENT_AUTH needs QM_TLS_CERT, QM_TLS_KEY and QM_TLS_CA (mutual TLS)"
            )
        for name, path in (("QM_TLS_CERT", self.cert), ("QM_TLS_KEY", self.key),
                           ("QM_TLS_CA", self.ca)):  # fmt: skip
            if path is not None:
                try:
                    self._pem[name] = path.read_bytes()
                except OSError as exc:
                    raise ValueError(f"{name} {path}: cannot read: {exc.strerror}") from None
        return self

    @property
    def enabled(self) -> bool:
        """Whether a server here listens with TLS."""
        return self.cert is not None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.enabled:
            return None
        return grpc.ssl_server_credentials(
            [(self._pem["QM_TLS_KEY"], self._pem["QM_TLS_CERT"])],
            root_certificates=self._pem.get("QM_TLS_CA") if self.client_auth else None,
            require_client_auth=self.client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Credentials that verify the server against ``QM_TLS_CA`` (and show this
        process's certificate, when it has one); None without a CA: plain text."""
        if self.ca is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self._pem["QM_TLS_CA"],
            private_key=self._pem.get("QM_TLS_KEY"),
            certificate_chain=self._pem.get("QM_TLS_CERT"),
        )


def aio_channel(
    target: str, tls: TlsSettings, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """A channel to ``target``: TLS when ``tls`` has a CA, else plain text."""
    credentials = tls.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def channel(
    target: str, tls: TlsSettings, options: list[tuple[str, Any]] | None = None
) -> grpc.Channel:
    """The blocking twin of ``aio_channel``."""
    credentials = tls.channel_credentials()
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)
