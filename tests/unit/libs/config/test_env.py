"""Settings from environment variables: only the named ones are read, and a bad value is an
error naming the variable."""

from __future__ import annotations

import pytest
from pydantic import Field

from libs.config.document import ConfigError
from libs.config.env import Address, EnvSettings, Names, Port


class Example(EnvSettings):
    clusters: Names = Field(("default",), alias="QM_CLUSTERS")
    address: Address = Field("127.0.0.1:50051", alias="QM_ADDR")
    port: Port = Field(6066, alias="QM_PORT")
    interval_s: float = Field(1.0, gt=0, alias="QM_INTERVAL")


def test_defaults_values_and_empty_variables() -> None:
    assert Example.from_env({"PATH": "/bin", "QM_PORT": ""}) == Example()
    got = Example.from_env(
        {"QM_CLUSTERS": " east, ,west ", "QM_ADDR": ":7000", "QM_PORT": "1", "QM_INTERVAL": "2.5"}
    )
    assert (got.clusters, got.address, got.port, got.interval_s) == (
        ("east", "west"),
        ":7000",
        1,
        2.5,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"QM_CLUSTERS": " , "}, 'QM_CLUSTERS: expected at least 1 item(s), got " , "'),
        ({"QM_ADDR": "localhost"}, "QM_ADDR: expected HOST:PORT such as 127.0.0.1:50051, got"),
        ({"QM_ADDR": "host:99999"}, "QM_ADDR: expected HOST:PORT"),
        ({"QM_PORT": "0"}, 'QM_PORT: expected a number >= 1, got "0"'),
        ({"QM_PORT": "http"}, 'QM_PORT: expected an integer, got "http"'),
        ({"QM_INTERVAL": "inf"}, 'QM_INTERVAL: expected a finite number, got "inf"'),
        ({"QM_INTERVAL": "-1"}, 'QM_INTERVAL: expected a number > 0, got "-1"'),
    ],
)
def test_a_bad_variable_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Example.from_env(env)
    assert str(caught.value).startswith(f"environment: {message}")
