"""``python -m services.ticker``: append clock ticks to the events topic.

Settings: ``QM_CLUSTERS`` (comma-separated, default ``default``),
``QM_TICK_SECONDS`` (default 1.0), the metrics settings of ``services.metrics_http``
(and the auth keys that check who reads them), plus the Kafka and topic settings.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import Field

from libs.auth import Keys
from libs.bus import EventProducer, KafkaBus, KafkaSettings, load_topic_config
from libs.config.env import EnvSettings, Names
from services.metrics_http import MetricsSettings, metrics_keys, metrics_server
from services.runtime import configure_logging, run_until_signalled
from services.ticker.service import PRODUCER, run
from services.trust import signing_key_from_env

log = logging.getLogger("ticker")


class TickerSettings(EnvSettings):
    clusters: Names = Field(("default",), alias="QM_CLUSTERS")
    tick_seconds: float = Field(1.0, gt=0, alias="QM_TICK_SECONDS")


async def serve(
    settings: TickerSettings,
    kafka: KafkaSettings,
    topic: str,
    keys: Keys | None,
    metrics: MetricsSettings,
) -> None:
    producer = EventProducer(
        KafkaBus(kafka), client_id=PRODUCER, sealer=signing_key_from_env("ticker")
    )
    started = asyncio.Event()
    async with metrics_server("ticker", keys, started.is_set, metrics):
        await producer.start()
        started.set()
        try:
            clusters, interval = list(settings.clusters), settings.tick_seconds
            log.info("ticking every %gs for %s", interval, ", ".join(clusters))
            await run(producer, topic, clusters, interval)
        finally:
            await producer.stop()


def main() -> None:
    configure_logging("ticker")
    settings, kafka, topics = (
        TickerSettings.from_env(),
        KafkaSettings.from_env(),
        load_topic_config(),
    )
    keys, metrics = metrics_keys(), MetricsSettings.from_env()
    asyncio.run(run_until_signalled(serve(settings, kafka, topics.events.name, keys, metrics)))


if __name__ == "__main__":
    main()
