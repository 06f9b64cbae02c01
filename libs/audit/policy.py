"""Policy settings from a mapping (a parsed YAML file): the knobs a replay must share.

Placement reads the same file (``QM_POLICY_FILE``); an auditor that uses other
values replays another policy, so unknown keys and wrong types are refused
rather than guessed at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from libs.core import PolicyConfig


def policy_from_mapping(raw: Mapping[str, object]) -> PolicyConfig:
    """A :class:`PolicyConfig` with ``raw``'s values over the defaults; keys are field names."""
    defaults = PolicyConfig()
    known = sorted(field.name for field in dataclasses.fields(PolicyConfig))
    if unknown := sorted(str(key) for key in raw if key not in known):
        raise ValueError(f"unknown policy setting(s) {unknown}; known: {known}")
    values = {name: _coerce(name, value, getattr(defaults, name)) for name, value in raw.items()}
    return dataclasses.replace(defaults, **values)


def _coerce(name: str, value: object, default: object) -> object:
    # The default's type is the field's type. Exact type checks, because YAML's
    # ``yes`` is a bool and bool is an int subclass; ints are fine for floats.
    expected = type(default)
    if expected is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if type(value) is expected or expected not in (bool, int, float, str):
        return value
    raise ValueError(f"policy setting {name}: expected {expected.__name__}, got {value!r}")
