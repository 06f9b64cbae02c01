"""Placement as the environment configures it: the Kafka and topic settings,
``QM_PLACEMENT_GROUP`` (the consumer group and transactional id) and ``QM_POLICY_FILE``
(the policy's knobs; auditors replay with the same file)."""

from __future__ import annotations

import os
from typing import TypeVar

from libs.bus import KafkaBus, KafkaSettings, load_topic_config
from services.placement.service import PlacementService
from services.policy_file import policy_from_env

Service = TypeVar("Service", bound=PlacementService)


def from_env(kind: type[Service], default_group: str = "qm-placement") -> Service:
    """A placement service of class ``kind`` on the environment's settings; in group
    ``default_group`` unless ``QM_PLACEMENT_GROUP`` names one."""
    return kind(
        KafkaBus(KafkaSettings.from_env()),
        load_topic_config(),
        group_id=os.environ.get("QM_PLACEMENT_GROUP", default_group),
        policy=policy_from_env(),
    )
