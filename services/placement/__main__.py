"""``python -m services.placement``: run the scheduler service.

Settings: ``QM_PLACEMENT_GROUP`` (consumer group and transactional id, default
``qm-placement``), ``QM_POLICY_FILE`` (YAML of PolicyConfig knobs; auditors
replay with the same file), plus the Kafka settings.
"""

import os

from libs.bus import KafkaBus, KafkaSettings, load_topic_config
from services.placement.service import PlacementService
from services.policy_file import policy_from_env
from services.runtime import run_service


def main() -> None:
    run_service(
        "placement",
        lambda: PlacementService(
            KafkaBus(KafkaSettings.from_env()),
            load_topic_config(),
            group_id=os.environ.get("QM_PLACEMENT_GROUP", "qm-placement"),
            policy=policy_from_env(),
        ).run(),
    )


if __name__ == "__main__":
    main()
