"""A service started with a bad config file or setting exits at once with one line naming
the file (or variable) and the key, and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVICES = ("admission", "budget", "placement", "projector", "ticker", "node_agent")


def start(service: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("QM_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}", *args],
        env={
            **clean,
            "QM_KAFKA_BOOTSTRAP": "127.0.0.1:9",  # never reached: the config fails first
            "QM_AUTH_SECRET": "t" * 32,
            "QM_PROJECTOR_DATA_DIR": str(tmp_path / "projector"),
            **env,
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("service", SERVICES)
def test_a_bad_topics_file_is_one_line(service: str, tmp_path: Path) -> None:
    topics = tmp_path / "topics.yaml"
    topics.write_text("partitions: 3\ntopics:\n  events: {name: qm.events, partitions: 0}\n")
    line = one_line(start(service, tmp_path, QM_TOPICS=str(topics)))
    assert line.startswith(f"{service.replace('_', '-')}: {topics}: ")
    assert "topics.events.partitions: expected a number >= 1, got 0" in line
    assert "topics.decisions: required" in line


@pytest.mark.parametrize("service", ["placement", "projector", "console"])
def test_a_bad_policy_file_is_one_line(service: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("hold_threshold: .nan\nlookback: 7d\n")
    line = one_line(start(service, tmp_path, QM_POLICY_FILE=str(policy)))
    assert f"{policy}: hold_threshold: expected a finite number, got NaN; lookback: unknown" in line


def test_a_bad_setting_is_one_line(tmp_path: Path) -> None:
    line = one_line(start("ticker", tmp_path, QM_TICK_SECONDS="soon"))
    assert line == 'ticker: environment: QM_TICK_SECONDS: expected a number, got "soon"'
    line = one_line(start("projector", tmp_path, QM_PROJECTOR_PORT="http"))
    assert line == 'projector: environment: QM_PROJECTOR_PORT: expected an integer, got "http"'
    line = one_line(start("console", tmp_path, QM_CONSOLE_PORT="http"))
    assert line == 'console: environment: QM_CONSOLE_PORT: expected an integer, got "http"'


def test_a_bad_inventory_is_one_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {node_id: a, gpu_type: H100, gpu_count: 8}\n")
    line = one_line(start("node_agent", tmp_path, "--nodes", str(nodes)))
    assert line == f"node-agent: {nodes}: nodes[0].gpu_memory_gib: required"


@pytest.mark.parametrize("service", ["admission", "budget"])
def test_the_shipped_placeholder_signing_secret_stops_a_service(
    service: str, tmp_path: Path
) -> None:
    kustomization = (REPO / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text()
    placeholder = kustomization.split("- secret=", 1)[1].split()[0]
    line = one_line(start(service, tmp_path, QM_AUTH_SECRET=placeholder))
    assert line.startswith(f"{service}: environment: signing secret 1 looks like a placeholder")


def test_a_bad_sandbox_is_one_line(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox.yaml"
    sandbox.write_text("default: root\n")
    line = one_line(start("node_agent", tmp_path, QM_SANDBOX=str(sandbox)))
    assert (
        line
        == f"node-agent: {sandbox}: default: tasks never run as root; name an unprivileged account"
    )
