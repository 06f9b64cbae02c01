"""Topic names and settings from ``deploy/topics.yaml`` (or ``$QM_TOPICS``).

``python -m libs.bus`` creates them; existing topics are kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from libs.bus.kafka import KafkaBus
from libs.bus.settings import KafkaSettings
from libs.config.document import load
from libs.config.topics import TopicsFile

_DEFAULT = Path(__file__).resolve().parents[2] / "deploy" / "topics.yaml"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    retention_ms: int | None = None
    compacted: bool = False
    max_message_bytes: int | None = None

    def configs(self) -> dict[str, str]:
        configs: dict[str, str] = {}
        if self.compacted:
            configs["cleanup.policy"] = "compact"
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        if self.max_message_bytes is not None:
            configs["max.message.bytes"] = str(self.max_message_bytes)
        return configs


@dataclass(frozen=True)
class Topics:
    events: TopicSpec
    decisions: TopicSpec
    deadletter: TopicSpec
    jobs_view: TopicSpec
    job_specs_view: TopicSpec
    job_tasks_view: TopicSpec
    nodes_view: TopicSpec
    snapshots: TopicSpec
    usage_snapshots: TopicSpec

    def all(self) -> list[TopicSpec]:
        return [
            self.events,
            self.decisions,
            self.deadletter,
            self.jobs_view,
            self.job_specs_view,
            self.job_tasks_view,
            self.nodes_view,
            self.snapshots,
            self.usage_snapshots,
        ]


def load_topic_config(path: Path | None = None) -> Topics:
    """The topics file; a ``ConfigError`` names the file and key when it is wrong."""
    file = load(TopicsFile, path or Path(os.environ.get("QM_TOPICS", _DEFAULT)))
    specs = {
        key: TopicSpec(
            name=entry.name,
            partitions=entry.partitions or file.partitions,
            replication_factor=file.replication_factor,
            retention_ms=entry.retention_ms,
            compacted=entry.compacted,
            max_message_bytes=entry.max_message_bytes,
        )
        for key, entry in file.topics
    }
    return Topics(**specs)


async def ensure_topics(settings: KafkaSettings, topics: Topics) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = KafkaBus(settings).admin()
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [spec for spec in topics.all() if spec.name not in existing]
        created = []
        for spec in wanted:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            name=spec.name,
                            num_partitions=spec.partitions,
                            replication_factor=spec.replication_factor,
                            topic_configs=spec.configs(),
                        )
                    ]
                )
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        await admin.close()
