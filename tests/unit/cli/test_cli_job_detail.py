"""``qm status JOB`` shows the job as it was submitted."""

from __future__ import annotations

from qm.v1 import types_pb2

from cli import render
from tests.unit.cli.conftest import text


def test_the_command_is_shown_as_a_shell_would_read_it() -> None:
    spec = types_pb2.JobSpec(command=["python3", "-c", "print([x for x in 'ab'])", "a b"])
    shown = text(render.job_detail(types_pb2.Job(job_id="j-1", spec=spec)))
    assert """python3 -c 'print([x for x in '"'"'ab'"'"'])' 'a b'""" in shown
