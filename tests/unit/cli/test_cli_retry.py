"""qm retries a call while the service is unavailable (gRPC's own retry policy), sends the
same request id on every attempt, gives up with one line, and never waits past a deadline."""

from __future__ import annotations

import re
import socket

import grpc
import pytest
from typer.testing import CliRunner

from cli import connection
from cli.app import app
from tests.unit.cli.conftest import Admission

SUBMIT = ["submit", "--gpus", "2", "--", "python", "train.py"]


def submit(admission: Admission, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*SUBMIT[:1], *extra, *SUBMIT[1:]], env=admission.env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_a_submission_that_meets_an_unavailable_service_is_retried_as_one_job(
    admission: Admission,
) -> None:
    admission.jobs.failures = 2
    code, output = submit(admission)
    assert code == 0, output
    assert "submitted j-1" in output
    ids = {request.spec.client_request_id for request in admission.jobs.requests}
    assert len(admission.jobs.requests) == 3 and len(ids) == 1 and ids != {""}


def test_a_request_id_given_by_the_user_is_the_one_sent(admission: Admission) -> None:
    admission.jobs.failures = 1
    code, _ = submit(admission, "--request-id", "nightly-42")
    assert code == 0
    assert [r.spec.client_request_id for r in admission.jobs.requests] == ["nightly-42"] * 2


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same policy with short backoffs, for the tests that use every attempt."""
    monkeypatch.setattr(connection, "RETRY", connection.Retry(5, 0.05, 0.1, 2.0))


@pytest.mark.usefixtures("quick_retries")
def test_a_service_that_stays_unavailable_gets_one_clear_line(admission: Admission) -> None:
    admission.jobs.failures = 99
    code, output = submit(admission)
    assert code == 1
    assert len(admission.jobs.requests) == connection.RETRY.attempts == 5
    [line] = output.strip().splitlines()
    pattern = (
        rf"error: admission at {admission.address} is unavailable after 5 attempts over \d+ s: "
        r"projector unreachable \(is the stack running\? `make up`\)"
    )
    assert re.fullmatch(pattern, line), line


@pytest.mark.usefixtures("quick_retries")
def test_nothing_listening_is_unavailable_after_the_retries(admission: Admission) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    result = CliRunner().invoke(app, SUBMIT, env={**admission.env, "QM_ADDR": dead})
    assert result.exit_code == 1
    assert f"admission at {dead} is unavailable after 5 attempts" in result.output


def test_other_errors_are_not_retried(admission: Admission) -> None:
    admission.jobs.failures, admission.jobs.fail_with = 1, grpc.StatusCode.INVALID_ARGUMENT
    code, output = submit(admission)
    assert code == 1 and len(admission.jobs.requests) == 1
    assert "error: INVALID_ARGUMENT: projector unreachable" in output


def test_no_call_waits_past_its_deadline(
    admission: Admission, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "DEADLINE_S", 0.3)
    admission.jobs.delay_s = 2.0
    code, output = submit(admission)
    assert code == 1
    assert f"admission at {admission.address} did not answer within 0.3 s" in output
