"""The policy knobs every driver of the core must share, from ``QM_POLICY_FILE``."""

from __future__ import annotations

import os
from pathlib import Path

from libs.config.policy import load_policy
from libs.core import PolicyConfig


def policy_from_env() -> PolicyConfig:
    path = os.environ.get("QM_POLICY_FILE")
    return load_policy(Path(path)) if path else PolicyConfig()
