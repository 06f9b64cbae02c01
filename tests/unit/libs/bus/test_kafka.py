"""KafkaBus is where every aiokafka client gets the cluster's address, its security
settings and the options that Quartermaster relies on."""

from __future__ import annotations

from unittest import mock

from libs.bus import KafkaBus, KafkaSettings

SETTINGS = KafkaSettings.from_env(
    {
        "QM_KAFKA_BOOTSTRAP": "k1:9093",
        "QM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "QM_KAFKA_SASL_MECHANISM": "PLAIN",
        "QM_KAFKA_SASL_USERNAME": "qm",
        "QM_KAFKA_SASL_PASSWORD": "secret",
    }
)
SECURITY = {
    "bootstrap_servers": "k1:9093",
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "qm",
    "sasl_plain_password": "secret",
}


def test_a_consumer_reads_committed_records_and_commits_only_when_told() -> None:
    with mock.patch("libs.bus.kafka.AIOKafkaConsumer") as built:
        KafkaBus(SETTINGS).consumer(group_id="g", auto_offset_reset="latest", fetch_max_bytes=1)
    assert built.call_args.kwargs == {
        **SECURITY,
        "group_id": "g",
        "auto_offset_reset": "latest",
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        # A group joined while the broker started sees its partitions within seconds.
        "metadata_max_age_ms": 10_000,
        "fetch_max_bytes": 1,
    }


def test_a_producer_is_idempotent_and_waits_for_every_replica() -> None:
    with mock.patch("libs.bus.kafka.AIOKafkaProducer") as built:
        KafkaBus(SETTINGS).producer(client_id="placement", transactional_id="qm-placement")
    assert built.call_args.kwargs == {
        **SECURITY,
        "client_id": "placement",
        "enable_idempotence": True,
        "acks": "all",
        "transactional_id": "qm-placement",
    }


def test_an_admin_client_has_the_same_address_and_security() -> None:
    with mock.patch("libs.bus.kafka.AIOKafkaAdminClient") as built:
        KafkaBus(SETTINGS).admin()
    assert built.call_args.kwargs == SECURITY
