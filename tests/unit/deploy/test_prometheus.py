"""The local Prometheus: its config is valid and scrapes every service where it serves its
metrics; its alert and recording rules pass their tests (alerts_test.yml) under promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.metrics_http import DEFAULT_PORTS
from services.projector.app import ProjectorSettings

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = ROOT / "deploy" / "local" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus)"
)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_every_service_is_scraped_on_its_default_port() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    scraped = {
        static["labels"]["service"]: int(static["targets"][0].rsplit(":", 1)[1])
        for static in job["static_configs"]
    }
    projector_port = ProjectorSettings.model_fields["port"].default
    assert scraped == {**DEFAULT_PORTS, "projector": projector_port}


@needs_promtool
def test_the_config_is_valid_with_the_token_file_stack_sh_writes(tmp_path: Path) -> None:
    # The token path is relative to the config: lay out a repository as stack.sh leaves it.
    config = tmp_path / "deploy" / "local" / "prometheus"
    shutil.copytree(PROMETHEUS, config)
    token = tmp_path / ".local" / "prometheus" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("a-token\n")
    checked = promtool("check", "config", "prometheus.yml", cwd=config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


@needs_promtool
def test_the_alert_and_recording_rules_pass_their_tests() -> None:
    tested = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
