"""qm submit --time, --after, --nodes and --gpus-per-node: what the spec carries, what is a
usage error, and how qm status JOB shows them; --signal too."""

from __future__ import annotations

import re

import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli import render
from cli.app import app
from tests.unit.cli.conftest import Admission, text

OK = types_pb2.DEPENDENCY_CONDITION_OK
ANY = types_pb2.DEPENDENCY_CONDITION_ANY


def submitted(admission: Admission, *flags: str) -> types_pb2.JobSpec:
    result = CliRunner().invoke(app, ["submit", *flags, "--", "train"], env=admission.env)
    assert result.exit_code == 0, result.output
    return admission.jobs.requests[-1].spec


def refused(admission: Admission, *flags: str) -> str:
    """The usage error of ``flags``: nothing is sent."""
    result = CliRunner().invoke(app, ["submit", *flags, "--", "train"], env=admission.env)
    assert result.exit_code == 2, result.output
    assert not admission.jobs.requests
    return " ".join(result.output.split())  # unwrapped from its box


@pytest.mark.parametrize(("flag", "seconds"), [("5s", 5), ("90m", 5400), ("2h", 7200), ("0.2", 1)])
def test_the_time_limit_travels_in_whole_seconds_rounded_up(
    admission: Admission, flag: str, seconds: int
) -> None:
    assert submitted(admission, "--time", flag).time_limit == Duration(seconds=seconds)


def test_without_a_time_limit_none_is_given(admission: Admission) -> None:
    assert not submitted(admission).HasField("time_limit")


def test_a_bad_time_limit_is_a_usage_error(admission: Admission) -> None:
    assert "Invalid value for '--time'" in refused(admission, "--time", "soon")


def test_after_takes_jobs_and_how_they_must_end(admission: Admission) -> None:
    spec = submitted(admission, "--after", "j-1", "--after", "j-2:any", "--after", "j-3:OK")
    assert [(d.job_id, d.condition) for d in spec.after] == [
        ("j-1", OK),
        ("j-2", ANY),
        ("j-3", OK),
    ]
    assert not submitted(admission).after


@pytest.mark.parametrize("flag", ["j-1:done", ":ok", "j-1:", ""])
def test_a_bad_dependency_is_a_usage_error_naming_the_flag(admission: Admission, flag: str) -> None:
    shown = refused(admission, "--after", flag)
    assert f"Invalid value for '--after': '{flag}' is not JOB[:ok|:any]" in shown


@pytest.mark.parametrize(
    ("flag", "signal", "seconds"),
    [("USR1@20s", "USR1", 20), ("sigusr2@2m", "USR2", 120), ("TERM@0.5s", "TERM", 1)],
)
def test_a_stop_warning_travels_as_a_signal_and_whole_seconds(
    admission: Admission, flag: str, signal: str, seconds: int
) -> None:
    warning = submitted(admission, "--signal", flag).stop_warning
    assert (warning.signal, warning.before) == (signal, Duration(seconds=seconds))
    assert not submitted(admission).HasField("stop_warning")


@pytest.mark.parametrize("flag", ["USR1", "KILL@20s", "USR1@soon", "USR1@0s", "@20s"])
def test_a_bad_stop_warning_is_a_usage_error_naming_the_flag(
    admission: Admission, flag: str
) -> None:
    assert "Invalid value for '--signal'" in refused(admission, "--signal", flag)


@pytest.mark.parametrize(
    ("flags", "gpus", "nodes"),
    [
        ((), 1, 0),
        (("--gpus", "4"), 4, 0),
        (("--nodes", "2", "--gpus-per-node", "8"), 16, 2),
        (("--gpus-per-node", "4"), 4, 1),  # one node
        (("--nodes", "3", "--gpus-per-node", "2", "--gpus", "6"), 6, 3),
        (("--gpus-per-node", "2", "--gpus", "2"), 2, 1),
    ],
)
def test_gpus_and_nodes(
    admission: Admission, flags: tuple[str, ...], gpus: int, nodes: int
) -> None:
    spec = submitted(admission, *flags)
    assert (spec.gpus, spec.nodes) == (gpus, nodes)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--nodes", "2"), "Invalid value for --nodes: give the GPUs on each node"),
        (
            ("--nodes", "2", "--gpus-per-node", "8", "--gpus", "8"),
            "Invalid value for --gpus: 8 GPUs are not --nodes 2 × --gpus-per-node 8 (16)",
        ),
        (("--gpus-per-node", "4", "--gpus", "8"), "8 GPUs are not --nodes 1 × --gpus-per-node 4"),
        (("--nodes", "0", "--gpus-per-node", "8"), "Invalid value for '--nodes'"),
        (("--nodes", "129", "--gpus-per-node", "8"), "Invalid value for '--nodes'"),
        (("--gpus-per-node", "65"), "Invalid value for '--gpus-per-node'"),
    ],
)
def test_gpus_that_disagree_with_the_nodes_are_a_usage_error(
    admission: Admission, flags: tuple[str, ...], says: str
) -> None:
    assert says in refused(admission, *flags)


def test_status_shows_the_time_limit_dependencies_and_nodes() -> None:
    spec = types_pb2.JobSpec(
        gpus=16,
        gpu_type="H100",
        nodes=2,
        time_limit=Duration(seconds=5400),
        after=[
            types_pb2.Dependency(job_id="j-1"),  # unspecified: as ok
            types_pb2.Dependency(job_id="j-2", condition=ANY),
        ],
        stop_warning=types_pb2.StopWarning(signal="USR1", before=Duration(seconds=120)),
    )
    job = types_pb2.Job(job_id="j", spec=spec)
    job.checkpointed_at.FromSeconds(1_700_000_000)
    shown = text(render.job_detail(job))
    assert re.search(r"warning +SIGUSR1 2m before SIGTERM", shown)
    assert re.search(r"checkpointed +20", shown)
    assert re.search(r"gpus +16×H100 \(2 nodes × 8\)", shown)
    assert re.search(r"time limit +1h30m", shown)
    assert re.search(r"after +j-1:ok, j-2:any", shown)
    plain = text(render.job_detail(types_pb2.Job(job_id="j", spec=types_pb2.JobSpec(gpus=2))))
    assert re.search(r"gpus +2×any +\n", plain) and re.search(r"time limit +-", plain)
    assert "after" not in plain and "warning" not in plain and "checkpointed" not in plain


def test_a_timed_out_job_is_shown_so() -> None:
    job = types_pb2.Job(
        job_id="j-1", state=types_pb2.JOB_STATE_TIMEOUT, reason="time limit 1h reached"
    )
    assert render.change(job) == "j-1 [red]TIMEOUT[/] time limit 1h reached"
    assert "TIMEOUT" in text(render.jobs_table([job]))
