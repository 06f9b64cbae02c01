"""qm submit --estimate: the expected run time travels with the spec, and qm status shows it."""

from __future__ import annotations

import re

from google.protobuf.duration_pb2 import Duration
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli import render
from cli.app import app
from tests.unit.cli.conftest import Admission, text


def test_submit_sends_the_estimate_in_seconds(admission: Admission) -> None:
    args = ["submit", "--estimate", "90m", "--", "train"]
    result = CliRunner().invoke(app, args, env=admission.env)
    assert result.exit_code == 0, result.output
    assert admission.jobs.requests[0].spec.runtime_estimate == Duration(seconds=5400)


def test_without_the_flag_no_estimate_is_given(admission: Admission) -> None:
    result = CliRunner().invoke(app, ["submit", "--", "train"], env=admission.env)
    assert result.exit_code == 0, result.output
    assert not admission.jobs.requests[0].spec.HasField("runtime_estimate")


def test_status_shows_the_estimate_where_one_was_given() -> None:
    given = types_pb2.Job(
        job_id="j", spec=types_pb2.JobSpec(runtime_estimate=Duration(seconds=5400))
    )
    assert re.search(r"estimate +5400 s", text(render.job_detail(given)))
    assert re.search(r"estimate +- ", text(render.job_detail(types_pb2.Job(job_id="j"))))
