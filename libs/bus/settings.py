"""Where the Kafka cluster is and how to reach it: one place, from the environment.

``QM_KAFKA_BOOTSTRAP`` (default ``127.0.0.1:9092``) points at any cluster;
``QM_KAFKA_SECURITY_PROTOCOL``, ``QM_KAFKA_SASL_MECHANISM``,
``QM_KAFKA_SASL_USERNAME``, ``QM_KAFKA_SASL_PASSWORD`` and
``QM_KAFKA_SSL_CAFILE`` are passed through to aiokafka.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None

    @classmethod
    def from_env(cls) -> KafkaSettings:
        env = os.environ.get
        return cls(
            bootstrap=env("QM_KAFKA_BOOTSTRAP", cls.bootstrap),
            security_protocol=env("QM_KAFKA_SECURITY_PROTOCOL", cls.security_protocol),
            sasl_mechanism=env("QM_KAFKA_SASL_MECHANISM"),
            sasl_username=env("QM_KAFKA_SASL_USERNAME"),
            sasl_password=env("QM_KAFKA_SASL_PASSWORD"),
            ssl_cafile=env("QM_KAFKA_SSL_CAFILE"),
        )

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
