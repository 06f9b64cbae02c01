"""A service started with a bad config file or setting exits at once with one line naming
the file (or variable) and the key, and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libs.auth.keygen import PUBLIC_KEYS, keygen
from libs.auth.tokens import SERVICE_SUBJECTS

REPO = Path(__file__).resolve().parents[3]
SERVICES = ("admission", "budget", "placement", "projector", "ticker", "node_agent")


def start(service: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("QM_", "OTEL_"))}
    keygen(tmp_path / "auth")
    own = {"QM_AUTH_SIGNING_KEY_FILE": str(tmp_path / "auth" / f"{service}.key")}
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}", *args],
        env={
            **clean,
            "QM_KAFKA_BOOTSTRAP": "127.0.0.1:9",  # never reached: the config fails first
            "QM_AUTH_PUBLIC_KEYS_FILE": str(tmp_path / "auth" / PUBLIC_KEYS),
            **(own if service in SERVICE_SUBJECTS else {}),
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


@pytest.mark.parametrize("service", ["admission", "budget", "console"])
def test_the_shipped_placeholder_public_keys_stop_a_service(service: str, tmp_path: Path) -> None:
    placeholder = REPO / "deploy" / "k8s" / "base" / "config" / "auth-public-keys.yaml"
    line = one_line(start(service, tmp_path, QM_AUTH_PUBLIC_KEYS_FILE=str(placeholder)))
    assert line.startswith(f"{service}: QM_AUTH_PUBLIC_KEYS_FILE {placeholder}: keys: expected at")
    assert "python -m libs.auth keygen" in line


def test_a_console_with_a_key_that_signs_users_tokens_does_not_start(tmp_path: Path) -> None:
    """The console signs its own token only: given the user-token issuer's key (or
    admission's), it refuses to start, naming the key."""
    for key in ("issuer", "admission"):
        path = tmp_path / "auth" / f"{key}.key"
        line = one_line(start("console", tmp_path, QM_AUTH_SIGNING_KEY_FILE=str(path)))
        assert line.startswith(f"console: QM_AUTH_SIGNING_KEY_FILE {path}: key {key} ")
        assert "for svc-console only: give it a key of its own" in line
    line = one_line(start("console", tmp_path, QM_AUTH_SIGNING_KEY_FILE=""))
    assert "no key to sign tokens with: set QM_AUTH_SIGNING_KEY_FILE" in line


def test_a_bad_sandbox_is_one_line(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox.yaml"
    sandbox.write_text("default: root\n")
    line = one_line(start("node_agent", tmp_path, QM_SANDBOX=str(sandbox)))
    assert (
        line
        == f"node-agent: {sandbox}: default: tasks never run as root; name an unprivileged account"
    )


def test_a_reader_of_the_log_without_a_usable_trust_file_is_one_line(tmp_path: Path) -> None:
    line = one_line(start("placement", tmp_path))
    assert "QM_TRUST_FILE is not set" in line and "python -m libs.trust init DIR" in line
    placeholder = tmp_path / "trust.yaml"
    placeholder.write_text("keys: []\n")
    line = one_line(start("placement", tmp_path, QM_TRUST_FILE=str(placeholder)))
    assert f"{placeholder}: keys: lists no key, so every record would be refused" in line


@pytest.mark.parametrize("service", ["budget", "ticker"])
def test_a_writer_of_the_log_without_its_key_is_one_line(service: str, tmp_path: Path) -> None:
    line = one_line(start(service, tmp_path))
    assert "QM_EVENTS_KEY_FILE is not set" in line
    garbage = tmp_path / "events.key"
    garbage.write_text("not a key\n")
    garbage.chmod(0o644)
    line = one_line(start(service, tmp_path, QM_EVENTS_KEY_FILE=str(garbage)))
    assert f"QM_EVENTS_KEY_FILE {garbage}: every account may read this private key" in line
    garbage.chmod(0o600)
    line = one_line(start(service, tmp_path, QM_EVENTS_KEY_FILE=str(garbage)))
    assert f"QM_EVENTS_KEY_FILE {garbage}: not an unencrypted PEM private key" in line
