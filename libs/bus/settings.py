"""Where the Kafka cluster is and how to reach it: one place, from the environment.

``QM_KAFKA_BOOTSTRAP`` (default ``127.0.0.1:9092``) points at any cluster;
``QM_KAFKA_SECURITY_PROTOCOL``, ``QM_KAFKA_SASL_MECHANISM``,
``QM_KAFKA_SASL_USERNAME``, ``QM_KAFKA_SASL_PASSWORD`` and
``QM_KAFKA_SSL_CAFILE`` are passed through to aiokafka.
"""

from __future__ import annotations

import ssl
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

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
    ssl_cafile: str | None = Field(None, alias="QM_KAFKA_SSL_CAFILE")

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
                sasl_plain_password=self.sasl_password,
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
                password=self.sasl_password,
                mechanism=self.sasl_mechanism,
                ssl_context=context,
            )
        return faust.SSLCredentials(context) if context else None
