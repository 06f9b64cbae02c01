"""``python -m services.placement``: run the scheduler service.

Settings: ``QM_PLACEMENT_GROUP`` (consumer group and transactional id, default
``qm-placement``), ``QM_POLICY_FILE`` (YAML of PolicyConfig knobs; auditors
replay with the same file), plus the Kafka settings.
"""

import asyncio
import os

from libs.bus import KafkaBus, KafkaSettings, load_topic_config
from libs.telemetry import setup_tracing
from services.placement.service import PlacementService
from services.policy_file import policy_from_env
from services.runtime import configure_logging, run_until_signalled


def main() -> None:
    configure_logging("placement")
    setup_tracing("placement")
    service = PlacementService(
        KafkaBus(KafkaSettings.from_env()),
        load_topic_config(),
        group_id=os.environ.get("QM_PLACEMENT_GROUP", "qm-placement"),
        policy=policy_from_env(),
    )
    asyncio.run(run_until_signalled(service.run()))


if __name__ == "__main__":
    main()
