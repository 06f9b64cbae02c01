"""Fixtures every node agent test may use."""

from __future__ import annotations

import pytest

from tests.unit.services.node_agent.doubles import Recorder


@pytest.fixture
def emitted() -> Recorder:
    return Recorder()
