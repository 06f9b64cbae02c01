from pathlib import Path

import faust
import pytest

from libs.bus import KafkaSettings
from libs.config.document import ConfigError


def test_plaintext_by_default() -> None:
    settings = KafkaSettings.from_env({})
    assert settings.client_kwargs()["security_protocol"] == "PLAINTEXT"
    assert settings.faust_credentials() is None


def test_sasl_and_tls_pass_through(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("QM_KAFKA_BOOTSTRAP", "k1:9093,k2:9093")
    monkeypatch.setenv("QM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("QM_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("QM_KAFKA_SASL_USERNAME", "qm")
    monkeypatch.setenv("QM_KAFKA_SASL_PASSWORD", "secret")
    monkeypatch.delenv("QM_KAFKA_SASL_PASSWORD_FILE", raising=False)
    settings = KafkaSettings.from_env()
    kwargs = settings.client_kwargs()
    assert kwargs["bootstrap_servers"] == "k1:9093,k2:9093"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "qm" and kwargs["ssl_context"] is not None
    assert settings.faust_broker() == "kafka://k1:9093;kafka://k2:9093"
    credentials = settings.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials) and credentials.username == "qm"


SASL = {"QM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "QM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}


def test_the_password_is_read_from_its_file_at_start(tmp_path: Path) -> None:
    (tmp_path / "placement").write_text("s3cret\n")
    settings = KafkaSettings.from_env(
        {**SASL, "QM_KAFKA_SASL_USERNAME": "placement",
         "QM_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "placement")}
    )  # fmt: skip
    assert settings.client_kwargs()["sasl_plain_password"] == "s3cret"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "QM_KAFKA_SASL_MECHANISM is set: set QM_KAFKA_SASL_USERNAME too"),
        ({"QM_KAFKA_SASL_USERNAME": "x"}, "set QM_KAFKA_SASL_PASSWORD_FILE"),
        (
            {"QM_KAFKA_SASL_USERNAME": "x", "QM_KAFKA_SASL_PASSWORD_FILE": "/nonexistent/pw"},
            "QM_KAFKA_SASL_PASSWORD_FILE /nonexistent/pw: cannot read: No such file",
        ),
        (
            {"QM_KAFKA_SASL_USERNAME": "x", "QM_KAFKA_SASL_PASSWORD_FILE": "/dev/null"},
            "QM_KAFKA_SASL_PASSWORD_FILE /dev/null: empty",
        ),
        (
            {"QM_KAFKA_SASL_USERNAME": "x", "QM_KAFKA_SASL_PASSWORD": "p",
             "QM_KAFKA_SASL_PASSWORD_FILE": "/dev/null"},
            "not both",
        ),
    ],
)  # fmt: skip
def test_missing_or_unreadable_credentials_stop_the_service_with_their_name(
    extra: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSettings.from_env({**SASL, **extra})
