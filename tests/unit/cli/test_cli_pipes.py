"""In a pipe, qm prints every column whole, so that grep and friends find what is there
(a terminal gets tables cut to its width)."""

from __future__ import annotations

from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli.app import app
from tests.unit.cli.conftest import Admission

LONG = "vision-detection-with-a-name-longer-than-any-terminal-column-would-show"


def test_a_listing_in_a_pipe_keeps_long_names_whole(admission: Admission) -> None:
    job = types_pb2.Job(
        job_id="j-0123456789abcdef",
        state=types_pb2.JOB_STATE_FAILED,
        exit_code=3,
        reason="the task wrote a long explanation of why it failed " * 3,
        spec=types_pb2.JobSpec(allocation=LONG, user="alice", gpus=8),
    )
    admission.jobs.listed = [job]
    result = CliRunner().invoke(app, ["status"], env={**admission.env, "COLUMNS": ""})
    assert result.exit_code == 0, result.output
    assert LONG in result.output and "j-0123456789abcdef" in result.output
    assert "…" not in result.output
