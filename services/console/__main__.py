"""``python -m services.console``: the web console on ``QM_CONSOLE_HOST``:``QM_CONSOLE_PORT``
(default 127.0.0.1:8080).

Reads the projector's views at ``QM_PROJECTOR_URL`` as ``svc-console`` (which must be in
the projector's ``QM_PROJECTOR_CLIENTS``) and the budget tree at ``QM_BUDGET_TARGET``
(gRPC, TLS per ``services.tls``). ``QM_OPERATORS`` see every job, as in admission.
``QM_CONSOLE_POLL_S`` (default 2) paces the refresh, ``QM_CONSOLE_JOB_LIMIT`` (default
5000) caps the newest jobs read, the lookback window is ``QM_LOOKBACK_WINDOW_S`` or the
policy file's. ``QM_CONSOLE_TLS_CERT`` and ``QM_CONSOLE_TLS_KEY`` serve HTTPS;
``QM_CONSOLE_SECURE_COOKIE=true`` marks the cookie Secure behind a TLS-terminating proxy.
Tokens: ``QM_AUTH_PUBLIC_KEYS_FILE`` checks users', ``QM_AUTH_SIGNING_KEY_FILE`` is the
console's own key, which may sign only for ``svc-console`` (``libs.auth.tokens``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Self

from aiohttp import web
from pydantic import Field, model_validator

from libs.auth import ServiceToken, load_keys, load_service_signer
from libs.auth.tokens import SERVICE_SUBJECTS
from libs.config.env import Address, EnvSettings, Port
from services.admission.budget_view import BudgetView
from services.console.feed import Feed
from services.console.starts import StartEstimates
from services.console.web_app import RUNNER_OPTIONS, make_app
from services.policy_file import policy_from_env
from services.projector.client import ProjectorClient
from services.runtime import cancel_and_wait, run_service
from services.tls import TlsSettings

log = logging.getLogger("qm.console")


class ConsoleSettings(EnvSettings):
    host: str = Field("127.0.0.1", min_length=1, alias="QM_CONSOLE_HOST")
    port: Port = Field(8080, alias="QM_CONSOLE_PORT")
    projector_url: str = Field("http://127.0.0.1:6066", min_length=1, alias="QM_PROJECTOR_URL")
    budget_target: Address = Field("127.0.0.1:50052", alias="QM_BUDGET_TARGET")
    # Asked for waiting jobs' estimated starts, with each user's own token.
    admission_target: Address = Field("127.0.0.1:50051", alias="QM_ADMISSION_TARGET")
    operators: str = Field("", alias="QM_OPERATORS")  # comma-separated, as admission's
    poll_s: float = Field(2.0, gt=0, alias="QM_CONSOLE_POLL_S")
    job_limit: int = Field(5000, ge=1, alias="QM_CONSOLE_JOB_LIMIT")
    lookback_window_s: float | None = Field(None, gt=0, alias="QM_LOOKBACK_WINDOW_S")
    tls_cert: Path | None = Field(None, alias="QM_CONSOLE_TLS_CERT")
    tls_key: Path | None = Field(None, alias="QM_CONSOLE_TLS_KEY")
    secure_cookie: bool = Field(False, alias="QM_CONSOLE_SECURE_COOKIE")

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set QM_CONSOLE_TLS_CERT and QM_CONSOLE_TLS_KEY together")
        return self

    @property
    def operator_names(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.operators.split(",") if name.strip())

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_cert, self.tls_key)
        return context


async def serve() -> None:
    own, keys = ConsoleSettings.from_env(), load_keys()
    token = ServiceToken("svc-console", load_service_signer(keys, SERVICE_SUBJECTS["console"]))
    projector = ProjectorClient(own.projector_url, token=token)
    tls = TlsSettings.from_env()
    budget = BudgetView(own.budget_target, token, tls)
    starts = StartEstimates(own.admission_target, tls)
    feed = Feed(
        projector,
        budget,
        window_s=own.lookback_window_s or policy_from_env().lookback_window_s,
        poll_s=own.poll_s,
        job_limit=own.job_limit,
        operators=own.operator_names,
    )
    context = own.ssl_context()
    app = make_app(feed, keys, starts, secure=context is not None or own.secure_cookie)
    runner = web.AppRunner(app, **RUNNER_OPTIONS)
    await runner.setup()
    refreshing = asyncio.create_task(feed.run())
    try:
        await web.TCPSite(runner, own.host, own.port, ssl_context=context).start()
        scheme = "https" if context else "http"
        log.info("console on %s://%s:%d/", scheme, own.host, own.port)
        await asyncio.Event().wait()  # until cancelled
    finally:
        await cancel_and_wait(refreshing)
        await runner.cleanup()
        await projector.close()
        await budget.close()
        await starts.close()


def main() -> None:
    run_service("console", serve)


if __name__ == "__main__":
    main()
