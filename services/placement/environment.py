"""Placement as the environment configures it: the Kafka and topic settings,
``QM_PLACEMENT_GROUP`` (the consumer group, and the prefix of the transactional ids),
``QM_POLICY_FILE`` (the policy's knobs; auditors replay with the same file),
``QM_PLACEMENT_INSTANCE`` (this instance's name to the bus, e.g. its pod's; default the
host name), ``QM_PLACEMENT_SNAPSHOT_EVERY`` (inputs between two snapshots of a
partition, default 50,000) and ``QM_TRUST_FILE`` (the service keys whose records it
folds, ``libs/trust/trustfile.py``; required)."""

from __future__ import annotations

import os
import socket
from typing import TypeVar

from libs.bus import KafkaBus, KafkaSettings, load_topic_config
from libs.events import release
from services.placement.service import PlacementService
from services.policy_file import policy_from_env
from services.trust import gate_from_env

Service = TypeVar("Service", bound=PlacementService)


def from_env(kind: type[Service], default_group: str = "qm-placement") -> Service:
    """A placement service of class ``kind`` on the environment's settings; in group
    ``default_group`` unless ``QM_PLACEMENT_GROUP`` names one."""
    try:
        release.current()  # named by every decision: a bad one stops the start, not them
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return kind(
        KafkaBus(KafkaSettings.from_env()),
        load_topic_config(),
        group_id=os.environ.get("QM_PLACEMENT_GROUP", default_group),
        policy=policy_from_env(),
        instance=f"placement-{os.environ.get('QM_PLACEMENT_INSTANCE') or socket.gethostname()}",
        snapshot_every=_count("QM_PLACEMENT_SNAPSHOT_EVERY", 50_000),
        gate=gate_from_env(),
    )


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"{name}={raw!r}: give a whole number of inputs, at least 1")
    return value
