"""The policy file: every knob of PolicyConfig, each with its range; nothing else."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from libs.config.document import ConfigError
from libs.config.policy import PolicyFile, load_policy, policy_from_mapping
from libs.core.config import (
    KnobDifference,
    PolicyConfig,
    config_digest,
    knob_differences,
    knobs,
)


def test_the_file_declares_every_knob_with_its_default() -> None:
    knobs = [field.name for field in dataclasses.fields(PolicyConfig)]
    assert list(PolicyFile.model_fields) == knobs
    assert policy_from_mapping({}, "p.yaml") == PolicyConfig()
    assert policy_from_mapping(None, "p.yaml") == PolicyConfig()  # an empty file


def test_knobs_come_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "lookback_window_s: 3600\ngpu_prices: {H100: 2, A100: 1.5}\nserving_mode: jit\n"
        "serving_cache_model: fifo-cost\nserving_planner: east-2\nserving_load_window_s: 60\n"
    )
    config = load_policy(path)
    assert config.lookback_window_s == 3600.0
    assert config.gpu_prices == (("A100", 1.5), ("H100", 2.0))
    assert (config.price("H100"), config.price("T4"), config.serving_mode) == (2.0, 1.0, "jit")
    assert (config.serving_cache_model, config.serving_planner) == ("fifo-cost", "east-2")
    assert config.serving_load_window_s == 60.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"lookback": 1}, "lookback: unknown key; known keys: lookback_window_s, "),
        ({"gpu_prices": {"H100": 0}}, "gpu_prices.H100: expected a number > 0, got 0"),
        ({"gpu_prices": ["H100"]}, 'gpu_prices: expected a mapping, got ["H100"]'),
        ({"gpu_prices": {str(i): 1 for i in range(257)}}, "gpu_prices: expected at most 256 items"),
        ({"hold_threshold": -1}, "hold_threshold: expected a number >= 0, got -1"),
        ({"admit_load": -0.5}, "admit_load: expected a number >= 0, got -0.5"),
        ({"admit_window_s": 0}, "admit_window_s: expected a number > 0, got 0"),
        # The load's state keeps every arrival this long: a day of them is a typo's cost.
        ({"arrival_window_s": 86400}, "arrival_window_s: expected a number <= 3600, got 86400"),
        # So does the serving pool's meter, a mark a second.
        ({"serving_load_window_s": 0}, "serving_load_window_s: expected a number > 0, got 0"),
        (
            {"serving_load_window_s": 86400},
            "serving_load_window_s: expected a number <= 3600, got 86400",
        ),
        # 0 would mean "the agent's own grace" on the bus: no shorter grace at all.
        ({"free_stop_grace_s": 0}, "free_stop_grace_s: expected a number > 0, got 0"),
        ({"adjust_threshold": float("nan")}, "adjust_threshold: expected a finite number, got NaN"),
        ({"lookback_window_s": float("inf")}, "lookback_window_s: expected a finite number"),
        ({"lookback_window_s": "7d"}, 'lookback_window_s: expected a number, got "7d"'),
        ({"serving_max_fraction": 1.5}, "serving_max_fraction: expected a number <= 1, got 1.5"),
        ({"adjust_joins": "yes please"}, 'adjust_joins: expected true or false, got "yes please"'),
        ({"serving_mode": "fast"}, "serving_mode: expected one of 'compass', 'heft', 'hash' or"),
        (
            {"serving_cache_model": "lru"},
            "serving_cache_model: expected one of 'lookahead' or 'fifo-cost', got \"lru\"",
        ),
        ({"serving_planner": "p" * 129}, "serving_planner: expected at most 128 characters"),
        ({"serving_planner": 3}, "serving_planner: expected a string, got 3"),
        ([1], "expected a mapping, got [1]"),
    ],
)
def test_bad_knobs_are_refused_naming_the_file_and_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        policy_from_mapping(raw, "policy.yaml")
    assert str(caught.value).startswith("policy.yaml: ")
    assert message in str(caught.value)


def test_the_digest_covers_every_knob_and_is_canonical(tmp_path: Path) -> None:
    default = PolicyConfig()
    assert list(knobs(default)) == list(PolicyFile.model_fields)
    assert knobs(default)["lookback_window_s"] == "604800.0"
    assert knobs(default)["gpu_prices"] == "[]"
    assert len(config_digest(default)) == 16
    path = tmp_path / "policy.yaml"
    path.write_text("gpu_prices: {H100: 2, A100: 1.5}\nlookback_window_s: 3600\n")
    # A file, ints or floats, the order of keys: the same knobs, the same digest.
    same = PolicyConfig(lookback_window_s=3600, gpu_prices=(("A100", 1.5), ("H100", 2)))
    assert config_digest(load_policy(path)) == config_digest(same) != config_digest(default)
    for field in dataclasses.fields(PolicyConfig):
        value = getattr(default, field.name)
        changed = dataclasses.replace(default, **{field.name: _another(value)})
        assert config_digest(changed) != config_digest(default), field.name


def _another(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, float):
        return value / 2 if value else 1.0
    return "heft" if isinstance(value, str) else (("H100", 2.0),)


def test_differing_knobs_are_named_with_both_values() -> None:
    recorded = knobs(PolicyConfig(lookback_window_s=86_400, node_lost_timeout_s=60))
    assert knob_differences(recorded, PolicyConfig()) == (
        KnobDifference("lookback_window_s", "86400.0", "604800.0"),
        KnobDifference("node_lost_timeout_s", "60.0", "30.0"),
    )
    assert knob_differences(recorded, PolicyConfig(), ["gpu_prices", "lookback_window_s"]) == (
        KnobDifference("lookback_window_s", "86400.0", "604800.0"),
    )
    unknown = knob_differences({**recorded, "newer_knob": "1.0"}, PolicyConfig(), ["newer_knob"])
    assert [d.describe("log", "replay") for d in unknown] == ["newer_knob: log 1.0, replay (none)"]
