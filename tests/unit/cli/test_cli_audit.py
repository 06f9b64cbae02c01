"""``qm audit verify``'s verdicts, the log read from the golden files instead of Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import cli.audit
from cli.app import app
from libs.audit import AuditResult, audit_logs
from libs.core import PolicyConfig
from libs.events.logfile import read_log
from tests.golden.record import HERE


@pytest.fixture(autouse=True)
def golden_log(monkeypatch: pytest.MonkeyPatch) -> None:
    async def from_files(settings: Any, topics: Any, config: PolicyConfig, **_: Any) -> AuditResult:
        inputs = read_log(HERE / "scheduler-basic.input.bin")
        recorded = read_log(HERE / "scheduler-basic.decisions.bin")
        return audit_logs(((0, o, env) for o, env in enumerate(inputs)), recorded, config)

    monkeypatch.setattr(cli.audit, "audit_topics", from_files)
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
    assert "343 decisions, 343 reproduced" in output


def test_other_knobs_are_named_before_any_divergence(tmp_path: Path) -> None:
    code, output = verify(tmp_path, "lookback_window_s: 86400\n")
    assert code == 1
    named = "configuration differs from the log's: lookback_window_s: log 604800.0, replay 86400.0"
    assert named in output.splitlines()
    assert output.index(named) < output.index("the first divergence is at partition 0")
    assert "differing fields: task_placed.provenance.config_digest" in output
