"""The policy knobs every driver of the core must share, from ``QM_POLICY_FILE``."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from libs.core import PolicyConfig
from libs.core.config import policy_from_mapping


def policy_from_env() -> PolicyConfig:
    path = os.environ.get("QM_POLICY_FILE")
    if not path:
        return PolicyConfig()
    return policy_from_mapping(yaml.safe_load(Path(path).read_text()) or {})
