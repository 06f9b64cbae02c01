"""Process plumbing shared by every service: run until SIGTERM or SIGINT, log one way,
end on a bad setting with one line instead of a traceback, and stop background work."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from libs.config.document import ConfigError
from libs.config.env import EnvSettings
from libs.telemetry import setup_tracing
from libs.telemetry.logs import LogFormat, configure_logs


def run_service(service: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The life of a service's process: log and trace as ``service``, then run ``main()``
    until SIGTERM or SIGINT. ``main`` is called once logging is set up, so that a bad
    setting it reads is reported in one line (``configure_logging``)."""
    configure_logging(service)
    setup_tracing(service)
    asyncio.run(run_until_signalled(main()))


async def run_until_signalled(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main``; on SIGTERM/SIGINT cancel it so its ``finally`` blocks clean up."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def cancel_and_wait(work: asyncio.Future[Any]) -> None:
    """Cancel background work and return once it has ended."""
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work


def report_config_errors(service: str) -> None:
    """A ``ConfigError`` that ends the process prints as ``SERVICE: FILE: KEY: expected ...``
    (exit status 1): the mistake is in a file or a variable, and a traceback would bury it."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if isinstance(error, ConfigError):
            print(f"{service}: {error}", file=sys.stderr)
        else:
            previous(kind, error, trace)

    sys.excepthook = hook


class _LogSettings(EnvSettings):
    level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(str.upper)
    ] = Field("INFO", alias="QM_LOG_LEVEL")
    form: Annotated[LogFormat, BeforeValidator(str.lower)] = Field("text", alias="QM_LOG_FORMAT")


def configure_logging(service: str) -> None:
    """One log format for every service (``libs.telemetry.logs``): ``QM_LOG_LEVEL`` sets
    the level, ``QM_LOG_FORMAT`` text (default) or json. Config errors from here on are
    reported in one line (``report_config_errors``)."""
    report_config_errors(service)
    settings = _LogSettings.from_env()
    configure_logs(service, settings.level, settings.form)
