"""``qm audit verify`` and ``qm export`` read the log as the auditor: on the real broker,
which authenticates every client, without the auditor's settings they say what to do,
and leave no Kafka client open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.stack import ROOT, Stack

COMMANDS = [("audit", "verify"), ("export", "--since", "1h", "--out", "day.qmlog")]
SASL = {"QM_KAFKA_SECURITY_PROTOCOL", "QM_KAFKA_SASL_MECHANISM", "QM_KAFKA_SASL_USERNAME"}
SASL |= {"QM_KAFKA_SASL_PASSWORD", "QM_KAFKA_SASL_PASSWORD_FILE"}


def qm(args: tuple[str, ...], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """qm in a process of its own: an unclosed client is reported when that process ends."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def said(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line, once nothing else was said."""
    assert result.returncode == 2 and result.stdout == "", result
    assert "Unclosed" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    return line


def without_credentials() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SASL}


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: args[0])
def test_without_the_auditors_settings_it_says_to_source_them(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    line = said(qm(args, without_credentials(), tmp_path))
    assert "closed the connection: it asks for credentials" in line, line
    assert "`source .local/auditor.env`" in line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: args[0])
def test_a_wrong_password_is_named(args: tuple[str, ...], tmp_path: Path) -> None:
    wrong = tmp_path / "password"
    wrong.write_text("not-the-password")
    wrong.chmod(0o600)
    env = {
        **without_credentials(),
        "QM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "QM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "QM_KAFKA_SASL_USERNAME": "auditor",
        "QM_KAFKA_SASL_PASSWORD_FILE": str(wrong),
    }
    line = said(qm(args, env, tmp_path))
    assert "refused the password of auditor" in line, line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: args[0])
def test_an_account_that_may_not_read_the_log_is_told_to_read_as_the_auditor(
    stack: Stack, args: tuple[str, ...], tmp_path: Path
) -> None:
    env = {**os.environ, **stack.env, **stack.principal_env("ticker")}  # writes ticks only
    line = said(qm(args, env, tmp_path))
    assert "does not let ticker read the log" in line, line
    assert "`source .local/auditor.env`" in line
