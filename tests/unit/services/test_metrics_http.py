"""Every service's /healthz, /readyz (open) and /metrics (a metrics client's token only),
served for real on a free port."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from libs.auth import SigningKey, issue_token
from libs.auth.keygen import PUBLIC_KEYS, keygen
from libs.auth.tokens import Keys
from libs.config.document import ConfigError
from libs.telemetry.metrics import DECISIONS
from services.metrics_http import DEFAULT_PORTS, MetricsSettings, metrics_keys, metrics_server

SIGNER = SigningKey.generate()
KEYS = Keys.trusting(SIGNER)
OTHER = SigningKey.generate()  # another installation's
SETTINGS = MetricsSettings.from_env({"QM_METRICS_PORT": "0"})


def bearer(user: str, signer: SigningKey = SIGNER) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(user, signer)}"}


async def test_probes_are_open_and_ready_follows_the_service() -> None:
    ready = False
    async with (
        metrics_server("placement", KEYS, lambda: ready, SETTINGS) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http,
    ):
        async with http.get("/healthz") as response:
            assert response.status == 200
        async with http.get("/readyz") as response:
            assert response.status == 503
        ready = True
        async with http.get("/readyz") as response:
            assert response.status == 200


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({}, 401, "missing 'Authorization: Bearer <token>'"),
        ({"Authorization": "Bearer junk"}, 401, "malformed token"),
        (bearer("svc-prometheus", OTHER), 401, "does not know"),
        (bearer("alice"), 403, "alice may not read metrics"),
        (bearer("svc-admission"), 403, "svc-admission may not read metrics"),
    ],
)
async def test_metrics_want_a_metrics_clients_token(
    headers: dict[str, str], status: int, says: str
) -> None:
    async with (
        metrics_server("budget", KEYS, lambda: True, SETTINGS) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http,
        http.get("/metrics", headers=headers) as response,
    ):
        assert response.status == status
        assert says in await response.text()


async def test_metrics_are_prometheus_text_for_the_metrics_client() -> None:
    DECISIONS.labels("task_placed").inc()
    settings = MetricsSettings.from_env({"QM_METRICS_PORT": "0", "QM_METRICS_CLIENTS": "scraper"})
    async with (
        metrics_server("admission", KEYS, lambda: True, settings) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http,
        http.get("/metrics", headers=bearer("scraper")) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/plain"
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    placed = [s for s in families["qm_decisions"].samples if s.labels == {"kind": "task_placed"}]
    assert placed and placed[0].value >= 1
    assert {"qm_consumer_lag_records", "qm_decision_seconds", "qm_gpus"} <= families.keys()


def test_each_service_has_its_own_default_port() -> None:
    assert len(set(DEFAULT_PORTS.values())) == len(DEFAULT_PORTS)
    assert MetricsSettings.from_env({}).port is None


async def test_without_public_keys_metrics_are_closed_and_probes_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Placement, the ticker and node agents need the public keys for /metrics only: a
    node may run without them, and nobody reads its metrics."""
    for name in ("QM_AUTH_PUBLIC_KEYS_FILE", "QM_OIDC_JWKS_URL"):
        monkeypatch.delenv(name, raising=False)
    keys = metrics_keys()
    assert keys is None
    async with (
        metrics_server("node_agent", keys, lambda: True, SETTINGS) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http,
    ):
        async with http.get("/metrics", headers=bearer("svc-prometheus")) as response:
            assert response.status == 503
        async with http.get("/readyz") as response:
            assert response.status == 200


def test_a_bad_public_keys_file_still_stops_the_service(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("QM_AUTH_PUBLIC_KEYS_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"QM_AUTH_PUBLIC_KEYS_FILE .*missing.yaml: cannot read"):
        metrics_keys()
    keygen(tmp_path / "keys")
    monkeypatch.setenv("QM_AUTH_PUBLIC_KEYS_FILE", str(tmp_path / "keys" / PUBLIC_KEYS))
    keys = metrics_keys()
    assert keys is not None and len(keys.public) == 3


async def test_no_request_leaves_a_token_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """The side door logs no requests (probes and scrapes every few seconds would bury the
    log): a token sent in the address or the header is written nowhere, refused or not."""
    caplog.set_level(logging.DEBUG)
    secret = issue_token("svc-prometheus", OTHER)
    async with (
        metrics_server("budget", KEYS, lambda: True, SETTINGS) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http,
    ):
        for path in ("/metrics", "/healthz", "/nowhere"):
            headers = {"Authorization": f"Bearer {secret}"}
            async with http.get(path, params={"token": secret}, headers=headers) as response:
                assert response.status in (200, 401, 404)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "metrics, health and readiness on" in logged  # the log was captured
    assert secret not in logged
