"""Where the services are, who the user is, and how calls to them fail, for every qm command.

``QM_ADDR`` (admission: JobService/ClusterService, default 127.0.0.1:50051),
``QM_BUDGET_ADDR`` (BudgetService, default 127.0.0.1:50052), and the token:
``QM_TOKEN``, else the file ``$QM_TOKEN_FILE`` (default ~/.config/qm/token).

Calls go over TLS, verifying the services against the CA of ``QM_TLS_CA`` (unset: the
local stack's ``.local/tls/ca.crt`` when run from the repository's root; set empty: none).
Without a CA, qm talks plain text to this machine only: a token sent in plain text to
another host could be read on the way (``QM_PLAINTEXT=1`` allows it on a trusted network).

Every call has a deadline, and gRPC itself retries a call that fails UNAVAILABLE
(the service is down or restarting), with exponential backoff: every qm call is
idempotent (a submission carries its client request id, the same on every attempt).
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from pydantic import Field

from libs.config.document import ConfigError
from libs.config.env import Address, EnvSettings
from services.grpc_server import bearer
from services.tls import TlsSettings, channel

DEFAULT_TOKEN_FILE = Path.home() / ".config" / "qm" / "token"
LOCAL_CA = Path(".local") / "tls" / "ca.crt"
# The longest any call may take, its retries included.
DEADLINE_S = 30.0
SERVICES = ("qm.v1.JobService", "qm.v1.ClusterService", "qm.v1.BudgetService")
T = TypeVar("T")


class NotSignedIn(Exception):
    pass


class CallFailed(Exception):
    """A call failed for good; the message is one line for a person."""


@dataclass(frozen=True)
class Retry:
    """gRPC's retry policy for UNAVAILABLE; a random backoff below the current one each time."""

    attempts: int = 5  # gRPC's most
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 4.0
    multiplier: float = 2.0

    def service_config(self) -> str:
        policy = {
            "maxAttempts": self.attempts,
            "initialBackoff": f"{self.initial_backoff_s:f}s",
            "maxBackoff": f"{self.max_backoff_s:f}s",
            "backoffMultiplier": self.multiplier,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        names = [{"service": service} for service in SERVICES]
        return json.dumps({"methodConfig": [{"name": names, "retryPolicy": policy}]})


RETRY = Retry()


@dataclass(frozen=True)
class Endpoint:
    """One service the CLI talks to: what to call it in messages, and where it is."""

    name: str
    address: str
    retry: Retry
    tls: TlsSettings

    def channel(self) -> grpc.Channel:
        options = [("grpc.enable_retries", 1), ("grpc.service_config", self.retry.service_config())]
        return channel(self.address, self.tls, options)

    def failure(self, error: grpc.RpcError, elapsed_s: float) -> str:
        """What went wrong, in one line that says what to do."""
        code, details = error.code(), error.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            return (
                f"{self.name} at {self.address} is unavailable after {self.retry.attempts} "
                f"attempts over {elapsed_s:.0f} s: {details} (is the stack running? `make up`)"
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{self.name} at {self.address} did not answer within {DEADLINE_S:g} s"
        return f"{code.name}: {details}"


class TokenSettings(EnvSettings):
    """Where qm keeps the caller's token."""

    token: str | None = Field(None, alias="QM_TOKEN")
    token_file: Path = Field(DEFAULT_TOKEN_FILE, alias="QM_TOKEN_FILE")


class _Settings(TokenSettings):
    plaintext: bool = Field(False, alias="QM_PLAINTEXT")
    address: Address = Field("127.0.0.1:50051", alias="QM_ADDR")
    budget_address: Address = Field("127.0.0.1:50052", alias="QM_BUDGET_ADDR")


@dataclass(frozen=True)
class Connection:
    admission: Endpoint
    budget: Endpoint
    token: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Connection:
        """The services and the token the environment names; a ``ConfigError`` for a bad
        address, ``NotSignedIn`` without a token."""
        env = dict(os.environ if environ is None else environ)
        settings = _Settings.from_env(env)
        if "QM_TLS_CA" not in env and LOCAL_CA.is_file():
            env["QM_TLS_CA"] = str(LOCAL_CA)
        tls = TlsSettings.from_env(env)
        if tls.ca is None and not settings.plaintext:
            for address in (settings.address, settings.budget_address):
                _refuse_plain_text_to_another_host(address)
        return cls(
            admission=Endpoint("admission", settings.address, RETRY, tls),
            budget=Endpoint("budget", settings.budget_address, RETRY, tls),
            token=settings.token.strip() if settings.token else _token(settings.token_file),
        )

    @property
    def metadata(self) -> tuple[tuple[str, Any], ...]:
        return bearer(self.token)

    def call(self, endpoint: Endpoint, method: Callable[..., T], request: object) -> T:
        """One unary call, retried by gRPC while the service is unavailable."""
        started = time.monotonic()
        try:
            return method(request, metadata=self.metadata, timeout=DEADLINE_S)
        except grpc.RpcError as exc:
            raise CallFailed(endpoint.failure(exc, time.monotonic() - started)) from exc


def _refuse_plain_text_to_another_host(address: str) -> None:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ConfigError(
        f"environment: {address} is another host and no CA is set: set QM_TLS_CA to the "
        "services' CA certificate (or QM_PLAINTEXT=1 on a network you trust)"
    )


def _token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise NotSignedIn(
            f"no token: sign in with `qm login` (it writes {path}), or set QM_TOKEN"
        ) from None
    except OSError as exc:
        raise NotSignedIn(f"cannot read the token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise NotSignedIn(f"cannot read the token file {path}: not a text file") from None
