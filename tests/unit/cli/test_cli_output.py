"""``-o json|yaml``: what scripts read from qm, and the filters of ``qm status``."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from qm.v1 import budget_service_pb2, types_pb2
from rich.console import Console
from typer.testing import CliRunner

from cli.app import app
from cli.output import Format, message, records, text
from cli.progress import counting
from tests.unit.cli.conftest import Admission

JOB = types_pb2.Job(
    job_id="j-42",
    state=types_pb2.JOB_STATE_RUNNING,
    node_id="n1",
    gpu_indices=[0, 1],
    spec=types_pb2.JobSpec(allocation="vision", user="ada", gpus=2, command=["train"]),
)
JOB.submitted_at.FromSeconds(1_760_000_000)


def qm(admission: Admission, *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=admission.env)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize(("flag", "read"), [("json", json.loads), ("yaml", yaml.safe_load)])
def test_a_list_is_every_field_of_every_job(
    admission: Admission, flag: str, read: Callable[[str], Any]
) -> None:
    admission.jobs.listed = [JOB]
    document = read(qm(admission, "status", "-o", flag))
    (job,) = document["jobs"]
    assert job["job_id"] == "j-42" and job["state"] == "JOB_STATE_RUNNING"
    assert job["spec"]["allocation"] == "vision" and job["spec"]["gpus"] == 2
    assert job["gpu_indices"] == [0, 1]
    assert job["submitted_at"] == "2025-10-09T08:53:20Z"
    assert job["exit_code"] == 0  # zeros are there: a script need not guess a default
    back = json_format.ParseDict(document["jobs"][0], types_pb2.Job())
    assert back == JOB


def test_one_job_as_json_is_the_job(admission: Admission) -> None:
    admission.jobs.listed = [JOB]
    document = json.loads(qm(admission, "status", "j-42", "--output", "JSON"))
    assert json_format.ParseDict(document, types_pb2.Job()) == JOB


def test_a_watched_job_is_a_document_per_change(admission: Admission) -> None:
    ended = types_pb2.Job()
    ended.CopyFrom(JOB)
    ended.state, ended.exit_code = types_pb2.JOB_STATE_FINISHED, 0
    admission.jobs.listed = [JOB, ended]
    lines = qm(admission, "watch", "j-42", "-o", "json").splitlines()
    changes = [json_format.Parse(line, types_pb2.Job()) for line in lines]
    assert changes == [JOB, ended]
    documents = list(yaml.safe_load_all(qm(admission, "watch", "j-42", "-o", "yaml")))
    assert [d["state"] for d in documents] == ["JOB_STATE_RUNNING", "JOB_STATE_FINISHED"]
    assert "j-42 FINISHED exit code 0" in qm(admission, "watch", "j-42")


def test_the_table_stays_the_default(admission: Admission) -> None:
    admission.jobs.listed = [JOB]
    shown = qm(admission, "status")
    assert "RUNNING" in shown and "vision" in shown
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown)


def test_filters_travel_in_the_request(admission: Admission) -> None:
    qm(admission, "status", "--user", "ada", "--allocation", "vision",
       "--state", "running,pending", "--state", "JOB_STATE_FAILED", "-o", "json")  # fmt: skip
    (request,) = admission.jobs.lists
    assert (request.user, request.allocation) == ("ada", "vision")
    assert list(request.states) == [
        types_pb2.JOB_STATE_RUNNING,
        types_pb2.JOB_STATE_PENDING,
        types_pb2.JOB_STATE_FAILED,
    ]


def test_an_unknown_state_lists_the_valid_ones(admission: Admission) -> None:
    env = {**admission.env, "COLUMNS": "400"}
    result = CliRunner().invoke(app, ["status", "--state", "napping"], env=env)
    assert result.exit_code == 2
    assert "'napping' is no job state" in result.output
    assert "SUBMITTED, REJECTED, PENDING, PLACED, RUNNING, FINISHED" in result.output
    assert admission.jobs.lists == []


def test_an_unknown_format_is_refused(admission: Admission) -> None:
    result = CliRunner().invoke(app, ["nodes", "-o", "xml"], env=admission.env)
    assert result.exit_code == 2
    assert "'xml' is not one of" in result.output


def test_documents_hold_the_same_data_in_json_and_yaml() -> None:
    balances = budget_service_pb2.GetBalancesResponse(
        balances=[budget_service_pb2.Balance(allocation="vision", entitlement=0.25)]
    )
    document = {"balances": message(balances), "rows": records(["A", "B"], [["1", "2"]])}
    assert json.loads(text(Format.JSON, document)) == yaml.safe_load(text(Format.YAML, document))
    assert yaml.safe_load(text(Format.YAML, document))["rows"] == [{"A": "1", "B": "2"}]


def test_a_simulation_report_for_scripts_holds_the_document_alone(tmp_path: Path) -> None:
    args = ["sim", "run", "--trace", "csv", "--policy", "fifo,budget", "--no-plots"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # the notes went to stderr
    assert (report["trace"], report["jobs"], report["gpus"]) == ("csv", 10, 48)
    (summary,) = report["tables"]
    assert [row["policy"] for row in summary["rows"]] == ["fifo", "budget"]
    assert str(tmp_path / "metrics.json") in report["wrote"]
    assert "10 jobs, 48 GPUs" in result.stderr


@pytest.mark.shared_data  # the Compass profiles
def test_a_workflow_sweep_for_scripts_states_its_cache_model_staleness_and_planners() -> None:
    args = ["sim", "workflows", "--gpus", "16", "--modes", "hash", "--arrivals", "poisson"]
    result = CliRunner().invoke(
        app,
        [
            *args,
            *("--jobs", "60", "--cache-model", "fifo-cost", "--staleness", "10ms"),
            *("--planners", "3", "-o", "json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["runs"], report["cache_model"], report["staleness_ms"]) == (1, "fifo-cost", 10)
    assert report["planners"] == 3
    assert all(
        "fifo-cost caches, reports 10 ms late, 3 planners" in table["title"]
        for table in report["tables"]
    )
    (row,) = report["tables"][0]["rows"]
    assert (row["GPUs"], row["mode"]) == ("16", "hash")
    assert "[1/1] poisson   16 GPUs hash" in result.stderr


@pytest.mark.shared_data  # the Compass profiles
def test_a_sweep_over_seeds_adds_each_settings_spread_and_claims_on_the_medians() -> None:
    args = ["sim", "workflows", "--gpus", "16", "--modes", "compass,hash", "--jobs", "60"]
    result = CliRunner().invoke(
        app, [*args, "--arrivals", "poisson", "--seeds", "2,1-2", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["runs"], report["seeds"]) == (4, [2, 1])
    runs, _, spread = report["tables"]
    assert [(r["mode"], r["seed"]) for r in runs["rows"]] == [
        ("compass", "2"), ("compass", "1"), ("hash", "2"), ("hash", "1"),
    ]  # fmt: skip
    assert spread["title"].endswith("slowdown over the seeds 2, 1")
    medians = {r["mode"]: r["median (seeds' range)"] for r in spread["rows"]}
    compass = sorted(float(r["median"]) for r in runs["rows"] if r["mode"] == "compass")
    low, high = (f"{v:.3f}" for v in compass)
    median, spread_of = medians["compass"].split(" ", 1)
    assert spread_of == f"({low}-{high})"
    # The median of the runs' own values: within a rounding of the mean of the shown ones.
    assert float(median) == pytest.approx((compass[0] + compass[1]) / 2, abs=0.001)


def test_no_bar_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with counting(Console(file=io.StringIO()), "steps", 3) as advance:
        advance(3)
    assert capsys.readouterr() == ("", "")
