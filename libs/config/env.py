"""Settings from environment variables, validated like a config file.

A settings class names each variable as a field's alias; ``from_env`` reads only
those, and a bad value is a ``ConfigError`` naming the variable:
``environment: QM_TICK_SECONDS: expected a number > 0, got "0"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from libs.config.document import validate

SOURCE = "environment"


class EnvSettings(BaseModel):
    """Values arrive as text, so numbers are parsed from it (lax); they must be finite.
    An empty variable counts as unset."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, validate_by_name=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        env = os.environ if environ is None else environ
        names = {field.alias or name for name, field in cls.model_fields.items()}
        return validate(cls, {k: v for k, v in env.items() if k in names and v != ""}, SOURCE)


def _names(value: object) -> object:
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return value


# ``east, west`` -> ("east", "west"); blanks between commas are dropped.
Names = Annotated[tuple[str, ...], BeforeValidator(_names), Field(min_length=1)]


def host_port(value: str) -> tuple[str, int]:
    """The host (an IPv6 one without its brackets) and port of HOST:PORT, else a
    ``ValueError`` saying so."""
    host, _, port = value.rpartition(":")
    if not (port.isdigit() and 0 <= int(port) <= 65535) or any(c.isspace() for c in host):
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:50051, got {value!r}")
    return host.strip("[]"), int(port)


def address(value: str) -> str:
    """``value`` if it is HOST:PORT, else a ``ValueError`` saying so."""
    host_port(value)
    return value


# host:port (":port" or "[::]:port" to listen on every interface; port 0 picks one).
Address = Annotated[str, AfterValidator(address)]
Port = Annotated[int, Field(ge=1, le=65535)]
