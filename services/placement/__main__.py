"""``python -m services.placement``: run the scheduler service."""

import asyncio
import logging
import os

from libs.bus import KafkaSettings, load_topic_config
from libs.telemetry import setup_tracing
from services.placement.service import PlacementService
from services.runtime import run_until_signalled


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("QM_LOG_LEVEL", "INFO"),
        format="%(asctime)s placement %(levelname)s %(message)s",
    )
    setup_tracing("placement")
    service = PlacementService(KafkaSettings.from_env(), load_topic_config())
    asyncio.run(run_until_signalled(service.run()))


if __name__ == "__main__":
    main()
