"""``qm audit verify``'s verdicts, the log read from the golden files instead of Kafka."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cli.audit
from cli.app import app
from libs.audit import AuditResult, audit_logs
from libs.core import PolicyConfig
from libs.events.logfile import read_log
from tests.golden.record import HERE


@pytest.fixture(autouse=True)
def golden_log(monkeypatch: pytest.MonkeyPatch) -> None:
    def from_files(settings: Any, topics: Any, config: PolicyConfig, **_: Any) -> AuditResult:
        inputs = read_log(HERE / "scheduler-basic.input.bin")
        recorded = read_log(HERE / "scheduler-basic.decisions.bin")
        return audit_logs(((0, o, env) for o, env in enumerate(inputs)), recorded, config)

    monkeypatch.setattr(cli.audit, "audit_parallel", from_files)
    monkeypatch.delenv("QM_TOPICS", raising=False)  # the default topics


def verify(tmp_path: Path, policy: str) -> tuple[int, str]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    env = {"QM_KAFKA_BOOTSTRAP": "127.0.0.1:1", "COLUMNS": "400"}
    result = CliRunner().invoke(app, ["audit", "verify", "--policy", str(path)], env=env)
    return result.exit_code, result.output


def test_the_knobs_placement_ran_with_reproduce_every_decision(tmp_path: Path) -> None:
    code, output = verify(tmp_path, "")
    assert code == 0, output
    assert "347 decisions, 347 reproduced" in output


def test_other_knobs_are_named_before_any_divergence(tmp_path: Path) -> None:
    code, output = verify(tmp_path, "lookback_window_s: 86400\n")
    assert code == 1
    named = "configuration differs from the log's: lookback_window_s: log 604800.0, replay 86400.0"
    assert named in output.splitlines()
    assert output.index(named) < output.index("the first divergence is at partition 0")
    assert "differing fields: task_placed.provenance.config_digest" in output


def test_the_verdict_as_json_for_scripts(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("lookback_window_s: 86400\n")
    env = {"QM_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    args = ["audit", "verify", "--policy", str(path), "-o", "json"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["inputs"] > 0
    assert report["config"] == [
        {"knob": "lookback_window_s", "log": "604800.0", "replay": "86400.0"}
    ]
    found = report["divergence"]
    assert found["partition"] == 0 and found["difference"] == "payload"
    assert found["fields"] == ["task_placed.provenance.config_digest"]
    assert found["replayed"]["task_placed"] and found["recorded"]["task_placed"]


def test_a_reproduced_log_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("")
    args = ["audit", "verify", "--policy", str(path), "-o", "yaml"]
    result = CliRunner().invoke(app, args, env={"QM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert result.exit_code == 0, result.output
    report = yaml.safe_load(result.stdout)
    assert report["ok"] is True and report["checked"] == report["reproduced"] == 347
    assert report["divergence"] is None
