"""qm submit --workflow FILE and qm status for a workflow job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from qm.v1 import types_pb2
from typer.testing import CliRunner

from cli import render
from cli.app import app, load_workflow
from libs.config.document import ConfigError
from libs.events.wire_time import milliseconds
from libs.sim.workflows import PROFILES
from tests.unit.cli.conftest import Admission, text

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "deploy" / "examples" / "workflow-translation.yaml"

COMPASS = {
    "models": {"OPT": 5720, "NLI": 2140},
    "workflows": {
        "question_answer": {
            "tasks": [
                {
                    "id": "opt",
                    "model": "OPT",
                    "run_ms": 560,
                    "in_kb": 1,
                    "out_kb": 2,
                    "parents": [],
                },
                {
                    "id": "nli",
                    "model": "NLI",
                    "run_ms": 27,
                    "in_kb": 1,
                    "out_kb": 1,
                    "parents": ["opt"],
                },
            ]
        },
        "glue": {"tasks": [{"id": "entry", "model": None, "run_ms": 0.6, "in_kb": 1, "out_kb": 1}]},
    },
}


def write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(content) if name.endswith(".json") else str(content))
    return path


def test_the_example_is_the_translation_workflow() -> None:
    workflow = load_workflow(EXAMPLE)
    assert workflow.name == "translation"
    assert [(t.task_id, t.model, t.model_mb) for t in workflow.tasks] == [
        ("opt", "OPT", 5720),
        ("marian", "marian", 800),
        ("mt5_a", "mt5", 2000),
        ("mt5_b", "mt5", 2000),
        ("aggregate", "", 0),
    ]
    assert list(workflow.tasks[-1].parents) == ["marian", "mt5_a", "mt5_b"]
    assert (
        milliseconds(workflow.tasks[0].run_duration),
        workflow.tasks[0].in_kb,
        workflow.tasks[0].out_kb,
    ) == (
        561,
        1,
        2,
    )


@pytest.mark.shared_data
def test_the_example_matches_the_compass_profiles() -> None:
    assert load_workflow(PROFILES, "translation") == load_workflow(EXAMPLE)


def test_the_compass_shape_takes_sizes_from_its_models(tmp_path: Path) -> None:
    path = write(tmp_path, "profiles.json", COMPASS)
    workflow = load_workflow(path, "question_answer")
    assert workflow.name == "question_answer"
    assert [(t.task_id, t.model_mb, list(t.parents)) for t in workflow.tasks] == [
        ("opt", 5720, []),
        ("nli", 2140, ["opt"]),
    ]
    glue = load_workflow(path, "glue")
    assert (glue.tasks[0].model, glue.tasks[0].model_mb) == ("", 0)
    assert milliseconds(glue.tasks[0].run_duration) == 0.6


def test_one_workflow_with_a_models_table(tmp_path: Path) -> None:
    raw = {"name": "qa", "models": COMPASS["models"], **COMPASS["workflows"]["question_answer"]}
    workflow = load_workflow(write(tmp_path, "qa.yaml", json.dumps(raw)))
    assert workflow.name == "qa" and workflow.tasks[1].model_mb == 2140


def test_a_file_of_one_workflow_is_named_after_it_or_the_file(tmp_path: Path) -> None:
    tasks = "tasks:\n  - {id: a, run_ms: 1, in_kb: 1, out_kb: 1}\n"
    assert load_workflow(write(tmp_path, "mine.yaml", tasks)).name == "mine"


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (COMPASS, "", "holds several workflows (question_answer, glue): pick one"),
        (COMPASS, "nope", "no workflow 'nope'; it has question_answer, glue"),
        (
            {"tasks": [{"id": "a", "model": "X", "run_ms": 1}]},
            "",
            "tasks[0].model: 'X' has no model_mb and is not in models",
        ),
        ({"tasks": [{"id": "a", "run_ms": "fast"}]}, "", "tasks[0].run_ms: expected a number"),
        ({"tasks": [{"id": "a", "run_ms": -1}]}, "", "tasks[0].run_ms: expected a number >= 0"),
        ({"tasks": [{"id": "a", "in_kb": 1, "size": 2}]}, "", "tasks[0].size: unknown key"),
        ({"tasks": ["a"]}, "", 'tasks[0]: expected a mapping, got "a"'),
        ({"tasks": []}, "", "tasks: expected at least 1 item(s)"),
        (
            {"tasks": [{"id": "a", "parents": "b"}]},
            "",
            'tasks[0].parents: expected a list, got "b"',
        ),
        ({"name": "x"}, "", "expected either tasks (one workflow) or workflows (several)"),
        ([1, 2], "", "expected a mapping"),
    ],
)
def test_bad_files_say_why(tmp_path: Path, content: Any, name: str, message: str) -> None:
    path = write(tmp_path, "bad.json", content)
    with pytest.raises(ConfigError) as caught:
        load_workflow(path, name)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


def test_submit_sends_the_workflow_without_a_command(admission: Admission) -> None:
    result = CliRunner().invoke(app, ["submit", "--workflow", str(EXAMPLE)], env=admission.env)
    assert result.exit_code == 0, result.output
    [request] = admission.jobs.requests
    assert request.spec.workflow == load_workflow(EXAMPLE)
    assert list(request.spec.command) == [] and request.spec.gpus == 1
    assert "submitted j-1" in result.output


def test_submit_sends_a_workflows_command(admission: Admission) -> None:
    args = ["submit", "--workflow", str(EXAMPLE), "--", "serve", "-v"]
    result = CliRunner().invoke(app, args, env=admission.env)
    assert result.exit_code == 0, result.output
    assert list(admission.jobs.requests[0].spec.command) == ["serve", "-v"]


def test_submit_needs_a_command_or_a_workflow(admission: Admission, tmp_path: Path) -> None:
    assert CliRunner().invoke(app, ["submit"], env=admission.env).exit_code == 2
    bad = write(tmp_path, "bad.json", {"tasks": []})
    env = {**admission.env, "COLUMNS": "400"}
    result = CliRunner().invoke(app, ["submit", "--workflow", str(bad)], env=env)
    assert result.exit_code == 2 and "tasks: expected at least 1 item(s)" in result.output
    assert admission.jobs.requests == []


def workflow_job() -> types_pb2.Job:
    spec = types_pb2.JobSpec(
        allocation="team-a", user="ada", gpus=1, workflow=load_workflow(EXAMPLE)
    )
    S = types_pb2.JobState
    return types_pb2.Job(
        job_id="j-1",
        spec=spec,
        state=S.JOB_STATE_RUNNING,
        tasks=[
            types_pb2.JobTask(name="opt", state=S.JOB_STATE_FINISHED, node_id="n1", gpu_index=0),
            types_pb2.JobTask(
                name="mt5_a",
                state=S.JOB_STATE_RUNNING,
                node_id="n2",
                gpu_index=3,
                planned_node_id="n1",
                planned_gpu_index=1,
            ),
            types_pb2.JobTask(name="marian", state=S.JOB_STATE_PENDING, planned_node_id="n1"),
        ],
    )


def test_status_shows_each_task_of_a_workflow() -> None:
    shown = text(render.job_detail(workflow_job()))
    assert "translation: 1/5 tasks finished" in shown
    lines = {line.split("│")[1].strip(): line for line in shown.splitlines() if line.count("│") > 3}
    assert "FINISHED" in lines["opt"] and "n1 GPU 0" in lines["opt"]
    assert "RUNNING" in lines["mt5_a"] and "n2 GPU 3" in lines["mt5_a"]
    assert "n1 GPU 1" in lines["mt5_a"]  # where it was planned
    assert "mt5 (2000 MB)" in lines["mt5_a"]
    assert "PENDING" in lines["marian"]
    assert {"mt5_b", "aggregate"} <= lines.keys()  # not on the log yet


def test_the_job_list_sums_up_a_workflow() -> None:
    shown = text(render.jobs_table([workflow_job()]))
    assert "1/5 tasks finished" in shown and "2 nodes" in shown


def test_a_batch_job_shows_no_task_table() -> None:
    job = types_pb2.Job(job_id="j-2", spec=types_pb2.JobSpec(gpus=2, command=["train"]))
    shown = text(render.job_detail(job))
    assert "TASK" not in shown and "train" in shown


def test_logs_of_a_workflow_that_ran_on_simulated_nodes_say_why_there_is_none(
    admission: Admission,
) -> None:
    """qm logs asks admission for any job, a workflow too (its tasks on process nodes
    keep output); where there is none, admission's reason is the one line shown."""
    admission.jobs.listed = [workflow_job()]
    result = CliRunner().invoke(app, ["logs", "j-1"], env=admission.env)
    assert result.exit_code == 1 and result.stdout == ""
    assert (
        "FAILED_PRECONDITION: job j-1 has no output: it ran on simulated node(s) n1, n2, "
        "which run no command"
    ) in result.stderr
