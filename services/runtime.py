"""Process plumbing shared by every service: run until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any


async def run_until_signalled(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main``; on SIGTERM/SIGINT cancel it so its ``finally`` blocks clean up."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def configure_logging(service: str) -> None:
    """One log format for every service; ``QM_LOG_LEVEL`` sets the level."""
    logging.basicConfig(
        level=os.environ.get("QM_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
    # The Kafka clients narrate every rebalance at INFO; keep their warnings only.
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
