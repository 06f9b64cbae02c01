"""Where the Kafka cluster is and how to reach it: one place, from the environment.

``QM_KAFKA_BOOTSTRAP`` (default ``127.0.0.1:9092``) points at any cluster;
``QM_KAFKA_SECURITY_PROTOCOL``, ``QM_KAFKA_SASL_MECHANISM``,
``QM_KAFKA_SASL_USERNAME``, ``QM_KAFKA_SASL_PASSWORD`` (or, better, the file named by
``QM_KAFKA_SASL_PASSWORD_FILE``: a value in the environment is inherited by every child
process) and ``QM_KAFKA_SSL_CAFILE`` are passed through to aiokafka.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, PrivateAttr, model_validator

from libs.config.env import EnvSettings, address


def _servers(value: str) -> str:
    for server in value.split(","):
        address(server.strip())
    return value


class KafkaSettings(EnvSettings):
    """``KafkaSettings.from_env()``, or by field name in tests."""

    # host:port[,host:port...]
    bootstrap: Annotated[str, AfterValidator(_servers)] = Field(
        "127.0.0.1:9092", alias="QM_KAFKA_BOOTSTRAP"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", alias="QM_KAFKA_SECURITY_PROTOCOL"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] | (
        None
    ) = Field(None, alias="QM_KAFKA_SASL_MECHANISM")
    sasl_username: str | None = Field(None, alias="QM_KAFKA_SASL_USERNAME")
    sasl_password: str | None = Field(None, alias="QM_KAFKA_SASL_PASSWORD", repr=False)
    sasl_password_file: Path | None = Field(None, alias="QM_KAFKA_SASL_PASSWORD_FILE")
    ssl_cafile: str | None = Field(None, alias="QM_KAFKA_SSL_CAFILE")
    _password: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _credentials(self) -> Self:
        """With SASL, a user and exactly one source of its password; the file is read now,
        so that a missing or unreadable one stops the service at start, with its name."""
        if not self.sasl_mechanism:
            return self
        if not self.sasl_username:
            raise ValueError("QM_KAFKA_SASL_MECHANISM is set: set QM_KAFKA_SASL_USERNAME too")
        self._password = self.sasl_password
        if self.sasl_password_file is not None:
            if self.sasl_password is not None:
                raise ValueError(
                    "set QM_KAFKA_SASL_PASSWORD or QM_KAFKA_SASL_PASSWORD_FILE, not both"
                )
            try:
                password = self.sasl_password_file.read_text().strip()
            except OSError as exc:
                raise ValueError(
                    f"QM_KAFKA_SASL_PASSWORD_FILE {self.sasl_password_file}: "
                    f"cannot read: {exc.strerror}"
                ) from None
            if not password:
                raise ValueError(f"QM_KAFKA_SASL_PASSWORD_FILE {self.sasl_password_file}: empty")
            self._password = password
        if not self._password:
            raise ValueError(
                "QM_KAFKA_SASL_MECHANISM is set: set QM_KAFKA_SASL_PASSWORD_FILE "
                "(or QM_KAFKA_SASL_PASSWORD)"
            )
        return self

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by every aiokafka client."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self._password,
            )
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = ssl.create_default_context(cafile=self.ssl_cafile)
        return kwargs

    def faust_broker(self) -> str:
        return ";".join(f"kafka://{host}" for host in self.bootstrap.split(","))

    def faust_credentials(self) -> Any:
        """The same security settings in faust's terms (None for plaintext)."""
        import faust  # only the projector needs faust; keep it off other services' imports

        tls = self.security_protocol in ("SSL", "SASL_SSL")
        context = ssl.create_default_context(cafile=self.ssl_cafile) if tls else None
        if self.sasl_mechanism:
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self._password,
                mechanism=self.sasl_mechanism,
                ssl_context=context,
            )
        return faust.SSLCredentials(context) if context else None
