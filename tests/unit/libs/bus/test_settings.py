import faust

from libs.bus import KafkaSettings


def test_plaintext_by_default() -> None:
    settings = KafkaSettings.from_env()
    assert settings.client_kwargs()["security_protocol"] == "PLAINTEXT"
    assert settings.faust_credentials() is None


def test_sasl_and_tls_pass_through(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("QM_KAFKA_BOOTSTRAP", "k1:9093,k2:9093")
    monkeypatch.setenv("QM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("QM_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("QM_KAFKA_SASL_USERNAME", "qm")
    monkeypatch.setenv("QM_KAFKA_SASL_PASSWORD", "secret")
    settings = KafkaSettings.from_env()
    kwargs = settings.client_kwargs()
    assert kwargs["bootstrap_servers"] == "k1:9093,k2:9093"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "qm" and kwargs["ssl_context"] is not None
    assert settings.faust_broker() == "kafka://k1:9093;kafka://k2:9093"
    credentials = settings.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials) and credentials.username == "qm"
