"""The projector app in memory: no broker, state emptied per test, its views served to a
client, dead letters captured, records sealed by their writers' keys (``signed``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast
from unittest import mock

import faust
import pytest
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from libs.auth import Keys, ServiceToken, SigningKey
from libs.readmodels import PlacementKnobs, UsageLedger
from services.projector import access, trust
from services.projector.app import app
from services.projector.client import ProjectorClient
from services.projector.inputs import deadletters
from services.projector.jobs.tables import job_specs, job_tasks, jobs, records
from services.projector.nodes.tables import nodes
from services.projector.usage import agents as usage_agents
from services.projector.usage import state as usage
from tests.unit.services.projector import signed

# A fixed key: pytest may import this file twice (as conftest, and from the tests).
SIGNER = SigningKey(Ed25519PrivateKey.from_private_bytes(b"projector-test-key".ljust(32, b"-")))
KEYS = Keys.trusting(SIGNER)


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
    token = ServiceToken("svc-admission", SIGNER)
    async with ProjectorClient(str(server.make_url("")), token=token) as client:
        yield client
    await server.close()


@pytest.fixture
def dead_letters() -> Iterator[mock.AsyncMock]:
    with mock.patch.object(deadletters, "send", mock.AsyncMock()) as send:
        yield send


def sent_headers(call: Any) -> dict[str, bytes]:
    return dict(call.kwargs["headers"])


@pytest.fixture(autouse=True)
def trusted(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trust file the projector checks the events topic's records with, and its own
    key, which signs the usage snapshots it writes: the fixed keys of ``signed``."""
    trust_file, key_file = signed.write_trust(tmp_path_factory.mktemp("trust"))
    monkeypatch.setenv("QM_TRUST_FILE", str(trust_file))
    monkeypatch.setenv("QM_EVENTS_KEY_FILE", str(key_file))
    usage_agents.signer.cache_clear()
    trust.gate.cache_clear()
