"""What qm makes of aiokafka's log while it reads the log itself: a refused password is
told by the error's type, and a read that succeeds passes aiokafka's warnings on."""

from __future__ import annotations

import logging

import pytest
import typer
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

from cli.log_access import reading_the_log
from libs.bus import KafkaSettings

AUDITOR = KafkaSettings(
    bootstrap="127.0.0.1:1",
    security_protocol="SASL_PLAINTEXT",
    sasl_mechanism="SCRAM-SHA-512",
    sasl_username="auditor",
    sasl_password="wrong",
)
# How aiokafka's client logs a broker it could not connect to, the error as an argument.
UNABLE = 'Unable connect to "%s:%s": %s'


def test_a_refused_password_is_named_and_aiokafkas_record_of_it_is_not_printed(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit), reading_the_log(AUDITOR):
        refused = SaslAuthenticationFailed("invalid credentials with SASL mechanism")
        logging.getLogger("aiokafka").error(UNABLE, "127.0.0.1", 1, refused)
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")
    (line,) = capsys.readouterr().err.splitlines()
    assert "Kafka at 127.0.0.1:1 refused the password of auditor" in line
    assert caplog.records == []


def test_a_read_that_succeeds_passes_aiokafkas_warnings_on_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with reading_the_log(AUDITOR):
        logging.getLogger("aiokafka").warning(UNABLE, "127.0.0.1", 1, ConnectionRefusedError())
        logging.getLogger("aiokafka.consumer.fetcher").warning("Not authorized to read %s", "t")
        assert caplog.records == [], "held back while it may yet fail"
    assert [record.getMessage() for record in caplog.records] == [
        'Unable connect to "127.0.0.1:1": ',
        "Not authorized to read t",
    ]
    logging.getLogger("aiokafka").warning("after")
    assert caplog.records[-1].getMessage() == "after", "then aiokafka's log is as it was"
