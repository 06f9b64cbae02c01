"""The topics file (``deploy/topics.yaml``, or ``$QM_TOPICS``): every topic Quartermaster uses.

``partitions`` and ``replication_factor`` apply to every topic; a topic may set its own
``partitions``, a ``retention_ms`` (-1: forever), ``compacted`` and ``max_message_bytes``
(its largest record, when that is over the broker's default).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from libs.config.document import FileModel

# Kafka's rule for topic names.
TopicName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
Count = Annotated[int, Field(ge=1)]


class TopicEntry(FileModel):
    name: TopicName
    partitions: Count | None = None
    retention_ms: Annotated[int, Field(ge=-1)] | None = None
    compacted: bool = False
    max_message_bytes: Annotated[int, Field(ge=1024)] | None = None


class TopicEntries(FileModel):
    events: TopicEntry
    decisions: TopicEntry
    deadletter: TopicEntry
    jobs_view: TopicEntry
    job_specs_view: TopicEntry
    job_tasks_view: TopicEntry
    nodes_view: TopicEntry
    snapshots: TopicEntry
    usage_snapshots: TopicEntry


class TopicsFile(FileModel):
    partitions: Count
    replication_factor: Count = 1
    topics: TopicEntries
