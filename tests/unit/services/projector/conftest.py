"""The projector app in memory: no broker, state emptied per test, its views served to a
client, dead letters captured."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast
from unittest import mock

import faust
import pytest
from aiohttp.test_utils import TestServer
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from libs.auth import Keys, ServiceToken
from libs.readmodels import PlacementKnobs, UsageLedger
from services.projector import access
from services.projector.app import app
from services.projector.client import ProjectorClient
from services.projector.inputs import deadletters
from services.projector.jobs.tables import job_specs, job_tasks, jobs, records
from services.projector.nodes.tables import nodes
from services.projector.usage import state as usage

KEYS = Keys((b"projector-test-key-" * 2,))


@pytest.fixture
def projector() -> Iterator[faust.App]:
    app.finalize()
    app.discover()  # imports agents, tables and views as the worker does
    app.flow_control.resume()
    yield app
    for table in (jobs, job_specs, job_tasks):
        table.data.clear()
    records.forget_cached()
    nodes.data.clear()
    usage.ledger = UsageLedger(usage.WINDOW_S)
    usage.rebuilt.clear()
    usage.placement = PlacementKnobs(usage.LEDGER_CONFIG, usage.LEDGER_KNOBS)


@pytest.fixture
async def client(projector: faust.App) -> AsyncIterator[ProjectorClient]:
    """A client of the app's views, served over HTTP."""
    access.allow(KEYS, frozenset({"svc-admission"}), frozenset({"svc-prometheus"}))
    server = TestServer(cast(AiohttpWeb, projector.web).web_app)
    await server.start_server()
    token = ServiceToken("svc-admission", KEYS)
    async with ProjectorClient(str(server.make_url("")), token=token) as client:
        yield client
    await server.close()


@pytest.fixture
def dead_letters() -> Iterator[mock.AsyncMock]:
    with mock.patch.object(deadletters, "send", mock.AsyncMock()) as send:
        yield send


def sent_headers(call: Any) -> dict[str, bytes]:
    return dict(call.kwargs["headers"])
