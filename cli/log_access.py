"""What qm says when it cannot read the log itself (``qm audit verify``, ``qm export``).

Those commands read Kafka with the ``QM_KAFKA_*`` settings, as the auditor: a broker
that authenticates its clients (the local one does, SASL SCRAM) closes the connection
of a client without credentials, and refuses a wrong password, and aiokafka then raises
a bare "unable to bootstrap", having logged the cause. So its log records are kept
while the log is read (not printed beside the error) and read back to say which it was,
and what to do.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from cli.render import fail
from libs.bus import KafkaSettings

AS_AUDITOR = "read the log as the auditor: `source .local/auditor.env` (make up writes it)"
_DENIED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)
_PROBE_S = 2.0


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def reading_the_log(settings: KafkaSettings) -> Iterator[None]:
    """Read the log inside; a failure to end the command with one line saying why."""
    kept, logger = _Kept(), logging.getLogger("aiokafka")
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(kept)
    try:
        yield
    except RuntimeError as exc:  # aiokafka's errors, and a topic that is not there
        raise fail(why(exc, settings, kept.messages)) from exc
    finally:
        logger.removeHandler(kept)
        logger.propagate = propagate


def why(exc: RuntimeError, settings: KafkaSettings, logged: list[str]) -> str:
    """What went wrong reading the log, and what to do about it."""
    kafka, user = f"Kafka at {settings.bootstrap}", settings.sasl_username
    if isinstance(exc, _DENIED):
        who = user or "a client without an account"
        return f"{kafka} does not let {who} read the log ({type(exc).__name__}): {AS_AUDITOR}"
    if any("Authentication failed" in message for message in logged):
        return (
            f"{kafka} refused the password of {user}: check QM_KAFKA_SASL_USERNAME and "
            f"QM_KAFKA_SASL_PASSWORD_FILE, or {AS_AUDITOR}"
        )
    if isinstance(exc, KafkaConnectionError):
        if settings.sasl_mechanism is None and _answers(settings.bootstrap):
            return (
                f"{kafka} closed the connection: it asks for credentials, and no "
                f"QM_KAFKA_SASL_* setting gives any; {AS_AUDITOR}"
            )
        return f"cannot reach {kafka} ({exc}): is it running, and does QM_KAFKA_BOOTSTRAP name it?"
    if user and "does not exist" in str(exc):
        return f"{exc} (or {user} may not see it: {AS_AUDITOR})"
    return str(exc)


def _answers(bootstrap: str) -> bool:
    """Whether the first broker accepts a connection at all."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=_PROBE_S):
            return True
    except OSError:
        return False
