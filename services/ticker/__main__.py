"""``python -m services.ticker``: append clock ticks to the events topic.

Settings: ``QM_CLUSTERS`` (comma-separated, default ``default``),
``QM_TICK_SECONDS`` (default 1.0), plus the Kafka and topic settings.
"""

from __future__ import annotations

import asyncio
import logging
import os

from libs.bus import EventProducer, KafkaSettings, load_topic_config
from services.runtime import configure_logging, run_until_signalled
from services.ticker.service import PRODUCER, run

log = logging.getLogger("ticker")


def clusters_from_env() -> list[str]:
    names = [name.strip() for name in os.environ.get("QM_CLUSTERS", "default").split(",")]
    return [name for name in names if name] or ["default"]


def interval_from_env() -> float:
    raw = os.environ.get("QM_TICK_SECONDS", "1.0")
    try:
        interval = float(raw)
    except ValueError:
        interval = -1.0
    if not interval > 0:  # also refuses nan
        raise SystemExit(f"QM_TICK_SECONDS must be a positive number of seconds, not {raw!r}")
    return interval


async def serve(clusters: list[str], interval: float) -> None:
    producer = EventProducer(KafkaSettings.from_env(), client_id=PRODUCER)
    await producer.start()
    try:
        log.info("ticking every %gs for %s", interval, ", ".join(clusters))
        await run(producer, load_topic_config().events.name, clusters, interval)
    finally:
        await producer.stop()


def main() -> None:
    configure_logging("ticker")
    clusters, interval = clusters_from_env(), interval_from_env()
    asyncio.run(run_until_signalled(serve(clusters, interval)))


if __name__ == "__main__":
    main()
