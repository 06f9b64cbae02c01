import pytest

from libs.core.config import PolicyConfig, policy_from_mapping


def test_knobs_come_from_a_mapping() -> None:
    config = policy_from_mapping({"lookback_window_s": 3600, "gpu_prices": {"H100": 2, "A100": 1}})
    assert config.lookback_window_s == 3600.0
    assert (config.price("H100"), config.price("A100"), config.price("T4")) == (2.0, 1.0, 1.0)
    assert policy_from_mapping({}) == PolicyConfig()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"lookback": 1}, "unknown policy setting 'lookback'"),
        ({"gpu_prices": {"H100": 0}}, "price of 'H100' must be > 0"),
        ({"hold_threshold": -1}, "hold_threshold: -1 must be a number >= 0"),
        ({"adjust_threshold": "nan"}, "adjust_threshold: 'nan' must be a number >= 0"),
    ],
)
def test_bad_knobs_are_refused_by_name(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy_from_mapping(raw)
