"""qm submit --wait exits as the job did: its own exit code once it ran to its end, a code
of its state's otherwise (``cli.exits``)."""

from __future__ import annotations

import pytest
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli import exits
from cli.app import app
from tests.unit.cli.conftest import Admission

S = types_pb2.JobState


def waited(admission: Admission, state: S.ValueType, exit_code: int = 0) -> int:
    """qm submit --wait's exit code for a job that runs, then ends so."""
    running = types_pb2.Job(job_id="j-1", state=S.JOB_STATE_RUNNING)
    ended = types_pb2.Job(job_id="j-1", state=state, exit_code=exit_code)
    admission.jobs.listed = [running, ended]
    result = CliRunner().invoke(app, ["submit", "--wait", "--", "train"], env=admission.env)
    assert "j-1 " in result.stdout and "RUNNING" in result.stdout, result.output
    return result.exit_code


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        (S.JOB_STATE_FINISHED, 0, 0),
        (S.JOB_STATE_FAILED, 3, 3),
        (S.JOB_STATE_FAILED, 255, 255),
        (S.JOB_STATE_FAILED, -9, 137),  # killed by SIGKILL, as a shell says
        (S.JOB_STATE_FAILED, 0, 1),  # it could not start
        (S.JOB_STATE_FAILED, 256, 1),  # a simulated code no shell gives
        (S.JOB_STATE_TIMEOUT, 0, 124),
        (S.JOB_STATE_CANCELLED, 0, 123),
        (S.JOB_STATE_PREEMPTED, 0, 122),
        (S.JOB_STATE_LOST, 0, 121),
        (S.JOB_STATE_REJECTED, 0, 120),
    ],
)
def test_wait_exits_as_the_job_ended(
    admission: Admission, state: S.ValueType, exit_code: int, expected: int
) -> None:
    assert waited(admission, state, exit_code) == expected


def test_every_end_but_a_run_to_its_end_has_a_code_of_its_own() -> None:
    ended = set(S.values()) - {
        S.JOB_STATE_UNSPECIFIED,
        S.JOB_STATE_SUBMITTED,
        S.JOB_STATE_PENDING,
        S.JOB_STATE_PLACED,
        S.JOB_STATE_RUNNING,
        S.JOB_STATE_FINISHED,
        S.JOB_STATE_FAILED,
    }
    assert set(exits.ENDED) == ended
    codes = set(exits.ENDED.values())
    assert len(codes) == len(ended) and codes.isdisjoint({0, 1, 2, 126, 127})
    assert all(code < exits.SIGNALLED for code in codes)


def test_a_stream_that_ends_before_the_job_does_is_a_failure(admission: Admission) -> None:
    assert waited(admission, S.JOB_STATE_RUNNING) == 1


def test_without_wait_the_command_succeeds_whatever_the_job_does(admission: Admission) -> None:
    result = CliRunner().invoke(app, ["submit", "--", "train"], env=admission.env)
    assert result.exit_code == 0 and "follow it with: qm status j-1" in result.stdout


def test_the_codes_are_in_the_help() -> None:
    shown = " ".join(CliRunner().invoke(app, ["submit", "--help"]).stdout.split())
    assert "TIMEOUT 124" in shown and "REJECTED 120" in shown and "128+N" in shown


def test_quiet_prints_the_job_id_alone_for_scripts(admission: Admission) -> None:
    admission.jobs.listed = [types_pb2.Job(job_id="j-1", state=S.JOB_STATE_TIMEOUT)]
    for flags, expected in (
        (["-q"], 0),
        (["--quiet", "--wait"], 124),  # no changes either: the exit code says how it ended
    ):
        result = CliRunner().invoke(app, ["submit", *flags, "--", "x"], env=admission.env)
        assert (result.stdout, result.exit_code) == ("j-1\n", expected), result.output
