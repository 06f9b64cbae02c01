"""What qm says when it cannot read the log itself (``qm audit verify``, ``qm export``).

Those commands read Kafka with the ``QM_KAFKA_*`` settings, as the auditor: a broker
that authenticates its clients (the local one does, SASL SCRAM) closes the connection
of a client without credentials, and refuses a wrong password, and aiokafka then raises
a bare "unable to bootstrap", having logged the cause (and a denied read is logged as
warnings before it is raised). So aiokafka's records are held back while the log is
read: a read that fails says why in one line instead, one that succeeds passes them on.
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
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

from cli.render import fail
from libs.bus import KafkaSettings, TopicMissing
from libs.config.env import host_port

AS_AUDITOR = "read the log as the auditor: `source .local/auditor.env` (make up writes it)"
_DENIED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)
_PROBE_S = 2.0


class _Held(logging.Handler):
    """aiokafka's records while the log is read (those its logger lets through: warnings
    and errors), and whether a broker refused the password, which aiokafka logs with the
    error as an argument before it raises a bare connection error."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.refused_password = False

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if any(isinstance(arg, SaslAuthenticationFailed) for arg in args):
            self.refused_password = True
        self.records.append(record)


@contextmanager
def reading_the_log(settings: KafkaSettings) -> Iterator[None]:
    """Read the log inside; a failure to end the command with one line saying why."""
    held, logger = _Held(), logging.getLogger("aiokafka")
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(held)
    try:
        yield
    except RuntimeError as exc:  # aiokafka's errors, and a topic that is not there
        raise fail(why(exc, settings, held.refused_password)) from exc
    finally:
        logger.removeHandler(held)
        logger.propagate = propagate
    for record in held.records:  # the read went through: what aiokafka warned of is shown
        logger.handle(record)


def why(exc: RuntimeError, settings: KafkaSettings, refused_password: bool) -> str:
    """What went wrong reading the log, and what to do about it."""
    kafka, user = f"Kafka at {settings.bootstrap}", settings.sasl_username
    if isinstance(exc, _DENIED):
        who = user or "a client without an account"
        return f"{kafka} does not let {who} read the log ({type(exc).__name__}): {AS_AUDITOR}"
    if refused_password:
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
    if user and isinstance(exc, TopicMissing):
        return f"{exc} (or {user} may not see it: {AS_AUDITOR})"
    return str(exc)


def _answers(bootstrap: str) -> bool:
    """Whether the first broker accepts a connection at all."""
    try:
        with socket.create_connection(host_port(bootstrap.split(",")[0].strip()), _PROBE_S):
            return True
    except OSError:
        return False
