"""``qm audit verify``'s verdicts, the log read from the golden files instead of Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cli.audit
from cli.app import app
from libs.audit import AuditResult, audit_logs
from libs.core import POLICY_VERSION, PolicyConfig
from libs.events import event_type
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


def report(tmp_path: Path, policy: str, form: str) -> tuple[int, Any]:
    """``qm audit verify -o json|yaml``'s exit code and document."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    args = ["audit", "verify", "--policy", str(path), "-o", form]
    result = CliRunner().invoke(app, args, env={"QM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    return result.exit_code, yaml.safe_load(result.stdout)  # JSON is YAML


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
    code, verdict = report(tmp_path, "lookback_window_s: 86400\n", "json")
    assert code == 1
    assert verdict["ok"] is False and verdict["inputs"] > 0
    assert verdict["config"] == [
        {"knob": "lookback_window_s", "log": "604800.0", "replay": "86400.0"}
    ]
    found = verdict["divergence"]
    assert found["partition"] == 0 and found["difference"] == "payload"
    assert found["fields"] == ["task_placed.provenance.config_digest"]
    assert found["replayed"]["task_placed"] and found["recorded"]["task_placed"]


def test_a_reproduced_log_as_yaml(tmp_path: Path) -> None:
    code, verdict = report(tmp_path, "", "yaml")
    assert code == 0
    assert verdict["ok"] is True and verdict["checked"] == verdict["reproduced"] == 347
    assert verdict["divergence"] is None


def _relabelled(monkeypatch: pytest.MonkeyPatch, version: int, release: str) -> None:
    """The golden log as release ``release`` of policy ``version`` recorded it."""

    def from_files(settings: Any, topics: Any, config: PolicyConfig, **_: Any) -> AuditResult:
        inputs = read_log(HERE / "scheduler-basic.input.bin")
        recorded = []
        for env in read_log(HERE / "scheduler-basic.decisions.bin"):
            payload = getattr(env, event_type(env))
            stated = (
                payload.provenance if "provenance" in payload.DESCRIPTOR.fields_by_name else payload
            )
            stated.policy_version, stated.release = version, release
            recorded.append(env)
        return audit_logs(((0, o, env) for o, env in enumerate(inputs)), recorded, config)

    monkeypatch.setattr(cli.audit, "audit_parallel", from_files)


def test_a_log_of_another_version_names_the_release_to_audit_it_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _relabelled(monkeypatch, POLICY_VERSION + 1, "0.2.0+g0123456789ab")
    code, output = verify(tmp_path, "")
    assert code == 3, output
    assert (
        f"347 decisions of partition 0 (inputs 5 to 809) were made by budget "
        f"v{POLICY_VERSION + 1}, not this release's budget v{POLICY_VERSION}: not checked; "
        "audit them with release 0.2.0+g0123456789ab"
    ) in output
    assert f"0 decisions of budget v{POLICY_VERSION}, 0 reproduced" in output
    assert "divergence" not in output


def test_a_log_from_before_releases_were_named_names_its_versions_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _relabelled(monkeypatch, 33, "")
    code, verdict = report(tmp_path, "", "json")
    assert code == 3
    assert verdict["ok"] is True and verdict["complete"] is False and verdict["checked"] == 0
    assert verdict["other_releases"] == [
        {
            "partition": 0,
            "policy": "budget",
            "policy_version": 33,
            "release": None,
            "commits": ["4e665a7", "87063b0"],
            "first_offset": 5,
            "last_offset": 809,
            "decisions": 347,
        }
    ]
    code, output = verify(tmp_path, "")
    assert code == 3
    assert "audit them with a checkout of commit 87063b0 (v33: 4e665a7 to 87063b0)" in output
