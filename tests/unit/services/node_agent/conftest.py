"""Fixtures every node agent test may use."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.services.node_agent.doubles import Recorder, close_executors


@pytest.fixture
def emitted() -> Recorder:
    return Recorder()


@pytest.fixture(autouse=True)
async def executors_closed() -> AsyncIterator[None]:
    yield
    await close_executors()
