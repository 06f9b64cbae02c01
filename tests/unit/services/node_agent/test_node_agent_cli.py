from __future__ import annotations

import pytest

from libs.core.compass import CacheModel
from services.node_agent.cli import parse_args
from services.node_agent.idle import IdleThresholds

IDLE_ENV = (
    "QM_IDLE_THRESHOLD",
    "QM_BUSY_THRESHOLD",
    "QM_IDLE_WINDOW_SECONDS",
    "QM_SAMPLE_SECONDS",
    "QM_HOST_TO_GPU_MB_PER_MS",
    "QM_NODE_ADDRESS",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in IDLE_ENV:
        monkeypatch.delenv(name, raising=False)


def test_idle_detection_defaults() -> None:
    args = parse_args([])
    assert (args.idle, args.sample_seconds) == (IdleThresholds(), 10.0)


def test_idle_detection_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QM_IDLE_WINDOW_SECONDS", "60")
    monkeypatch.setenv("QM_SAMPLE_SECONDS", "30")
    args = parse_args(
        ["--idle-threshold", "0.1", "--busy-threshold", "0.2", "--sample-seconds", "5"]
    )
    assert (args.idle, args.sample_seconds) == (IdleThresholds(0.1, 0.2, 60.0), 5.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--idle-threshold", "0.3"], "need 0 <= idle threshold <= busy threshold <= 1"),
        (["--idle-window-seconds", "0"], "the idle window must be > 0 seconds"),
        (["--sample-seconds", "0"], "--sample-seconds must be > 0"),
        (["--idle-window-seconds", "nan"], "expected a finite number, got 'nan'"),
        (["--grace-seconds", "inf"], "expected a finite number, got 'inf'"),
        (["--host-to-gpu-mb-per-ms", "0"], "--host-to-gpu-mb-per-ms must be > 0"),
    ],
)
def test_bad_idle_settings_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_bad_setting_in_the_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QM_BUSY_THRESHOLD", "lots")
    with pytest.raises(SystemExit):
        parse_args([])
    expected = "argument --busy-threshold: expected a finite number, got 'lots'"
    assert expected in capsys.readouterr().err


def test_model_load_bandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args([]).host_to_gpu_mb_per_ms == 10.171
    monkeypatch.setenv("QM_HOST_TO_GPU_MB_PER_MS", "20")
    assert parse_args([]).host_to_gpu_mb_per_ms == 20.0
    assert parse_args(["--host-to-gpu-mb-per-ms", "5"]).host_to_gpu_mb_per_ms == 5.0


def test_the_cache_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_args([]).cache_model is CacheModel.LOOKAHEAD
    monkeypatch.setenv("QM_CACHE_MODEL", "fifo-cost")
    assert parse_args([]).cache_model is CacheModel.FIFO_COST
    assert parse_args(["--cache-model", "lookahead"]).cache_model is CacheModel.LOOKAHEAD
    monkeypatch.setenv("QM_CACHE_MODEL", "lru")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "expected lookahead or fifo-cost, got 'lru'" in capsys.readouterr().err


def test_the_nodes_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """None: each declared node's own, else 127.0.0.1; an NVML node's host name."""
    assert parse_args([]).address is None
    monkeypatch.setenv("QM_NODE_ADDRESS", "10.0.0.5")
    assert parse_args([]).address == "10.0.0.5"
    assert parse_args(["--address", "gpu-5.example.org"]).address == "gpu-5.example.org"
    monkeypatch.setenv("QM_NODE_ADDRESS", "gpu 5")
    with pytest.raises(SystemExit):
        parse_args([])
    expected = "argument --address: expected no whitespace or control characters, got 'gpu 5'"
    assert expected in capsys.readouterr().err
