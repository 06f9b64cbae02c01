"""``qm sim run --trace eventlog``: what it replays, what it leaves out and why, what it
writes (nothing without --out), and nothing on stderr but its notes."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2
from typer.testing import CliRunner

from cli.app import app
from libs.events import new_envelope
from libs.events.logfile import write_log


def recorded_day(path: Path) -> Path:
    """Four charged jobs that ran, one still running and one still waiting at the end;
    no free or debug work (a plot per class has empty panels)."""
    count = 0

    def env(payload: Message, second: int) -> events_pb2.Envelope:
        nonlocal count
        count += 1
        at = datetime.fromtimestamp(1_767_225_600 + second, UTC)
        return new_envelope(payload, producer="test", occurred=at, event_id=f"e{count}")

    tree = types_pb2.BudgetTree(
        nodes=[
            types_pb2.BudgetNode(name="root", weight=1),
            types_pb2.BudgetNode(name="a", parent="root", weight=1, members=["u"]),
        ]
    )
    inventory = types_pb2.NodeInventory(
        node_id="n1", gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(8)]
    )
    records = [env(events_pb2.BudgetChanged(tree=tree), 0)]
    records.append(env(events_pb2.NodeRegistered(inventory=inventory), 1))
    spec = types_pb2.JobSpec(
        allocation="a", user="u", gpus=2, command=["x"], min_runtime=Duration(seconds=7200)
    )
    for i in range(6):
        job, task = f"j{i}", f"j{i}/0"
        records.append(env(events_pb2.JobAdmitted(job_id=job, spec=spec), 10 + i))
        if i < 5:  # j5 waits
            started = events_pb2.TaskStarted(job_id=job, task_id=task, node_id="n1")
            records.append(env(started, 20 + i))
        if i < 4:  # j4 runs
            ended = events_pb2.TaskFinished(job_id=job, task_id=task, node_id="n1")
            records.append(env(ended, 600 + i))
    write_log(path, sorted(records, key=lambda r: r.occurred_at.seconds))
    return path


def test_without_out_it_prints_the_summary_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = recorded_day(tmp_path / "day.qmlog")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["sim", "run", "--trace", "eventlog", "--trace-path", str(log), "--policy", "fifo"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert list(work.iterdir()) == []
    lines = result.stdout.splitlines()
    assert "4 jobs, 8 GPUs on 1 nodes" in lines[0]
    assert lines[1] == (
        "2 of the log's 6 jobs left out, with no run to replay: 1 still running when the "
        "log ends; 1 still waiting when the log ends"
    )
    assert lines[-1] == "nothing written: --out DIR writes metrics.json, summary.md and plots/"
    assert result.stderr == ""


def test_the_report_lists_the_jobs_left_out_and_its_plots_warn_of_nothing(
    tmp_path: Path,
) -> None:
    log = recorded_day(tmp_path / "day.qmlog")
    out = tmp_path / "report"
    args = ["sim", "run", "--trace", "eventlog", "--trace-path", str(log), "--policy", "all"]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, [*args, "--out", str(out), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert [str(w.message) for w in warned] == []
    report = json.loads(result.stdout)
    assert report["jobs"] == 4
    assert report["left_out"] == [
        {"job_id": "j4", "why": "still running when the log ends"},
        {"job_id": "j5", "why": "still waiting when the log ends"},
    ]
    assert len([p for p in report["wrote"] if p.endswith(".png")]) == 6
    summary = (out / "summary.md").read_text()
    assert "- **Left out**: 2 of the log's 6 jobs left out" in summary
    assert "| j4 | still running when the log ends |" in summary
    note = "2 of the log's 6 jobs left out, with no run to replay: 1 still running when the "
    note += f"log ends; 1 still waiting when the log ends (listed in {out / 'summary.md'})"
    assert note in result.stderr.splitlines()  # a whole line, however long
