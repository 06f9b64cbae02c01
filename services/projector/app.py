"""The projector's one faust App: folds the event log into queryable read models.

Configured from the environment (``ProjectorSettings``): ``QM_PROJECTOR_APP_ID`` (also
the consumer group and the prefix of the table changelogs), ``QM_PROJECTOR_HOST`` and
``QM_PROJECTOR_PORT`` for the web server, ``QM_PROJECTOR_DATA_DIR`` for faust's
data folder (default: in the temp dir), the usage ledger's ``QM_LOOKBACK_WINDOW_S`` and
``QM_SNAPSHOT_SECONDS``, ``QM_PROJECTOR_CLIENTS`` (the services whose tokens may read
the views; ``services.projector.access``), the Kafka settings of ``libs.bus``, the topic config of
``QM_TOPICS`` and the policy file of ``QM_POLICY_FILE``; all read when this module is
imported, so that a bad one stops the worker before it starts. The trust file of
``QM_TRUST_FILE``, which every record of the events topic is checked with before it is
folded (``services.projector.trust``), and the projector's own key, ``QM_EVENTS_KEY_FILE``,
are read as the worker starts.

Co-partitioning: the events and decisions topics are both keyed by cluster and
have the same partition count as the table changelogs, so everything about one
job or node arrives on partition P of either topic and is written to changelog
partition P. Views read the local tables and know nothing of routing, so a
single worker must own every partition; more workers would need table_route
and a key-to-partition map. The usage ledger is no table: it is rebuilt from
the events topic on every start (see ``services.projector.usage``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import faust
from faust.types import TableT
from pydantic import BeforeValidator, Field

from libs.bus import KafkaSettings, load_topic_config
from libs.bus.topics import TopicSpec
from libs.config.env import EnvSettings, Names, Port
from services.policy_file import policy_from_env
from services.projector.access import require_client


class ProjectorSettings(EnvSettings):
    app_id: str = Field("qm-projector", min_length=1, alias="QM_PROJECTOR_APP_ID")
    host: str = Field("127.0.0.1", min_length=1, alias="QM_PROJECTOR_HOST")
    port: Port = Field(6066, alias="QM_PROJECTOR_PORT")
    data_dir: Path | None = Field(None, alias="QM_PROJECTOR_DATA_DIR")
    # The usage ledger's window (default: the policy file's, as placement) and how often
    # changed snapshots are published.
    lookback_window_s: float | None = Field(None, gt=0, alias="QM_LOOKBACK_WINDOW_S")
    snapshot_seconds: float = Field(10.0, gt=0, alias="QM_SNAPSHOT_SECONDS")
    # Who may read the views (tokens' users); see services.projector.access.
    clients: Names = Field(("svc-admission", "svc-console"), alias="QM_PROJECTOR_CLIENTS")
    log_level: Annotated[
        Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(str.lower)
    ] = Field("warning", alias="QM_PROJECTOR_LOGLEVEL")


SETTINGS = ProjectorSettings.from_env()
POLICY = policy_from_env()
APP_ID = SETTINGS.app_id
TOPICS = load_topic_config()
KAFKA = KafkaSettings.from_env()

app = faust.App(
    APP_ID,
    broker=KAFKA.faust_broker(),
    broker_credentials=KAFKA.faust_credentials(),
    # Modules holding agents, tables and views; imported by the worker at start.
    autodiscover=[
        "services.projector.jobs",
        "services.projector.nodes",
        "services.projector.usage",
        "services.projector.health",
        "services.projector.metrics",
    ],
    origin="services.projector.app",
    topic_partitions=TOPICS.events.partitions,
    store="memory://",
    # Tables live in memory, but faust still makes <datadir>/v1/tables; keep it out of the CWD.
    datadir=SETTINGS.data_dir or os.path.join(tempfile.gettempdir(), f"{APP_ID}-data"),
    key_serializer="raw",
    value_serializer="raw",
    web_bind=SETTINGS.host,
    web_host=SETTINGS.host,
    web_port=SETTINGS.port,
    web_application_options={"middlewares": [require_client]},
    # Static group membership: a worker restarted after a crash takes its
    # partitions back at once instead of waiting out the dead member's session
    # (about a minute). It also means one worker per app id, as said above.
    consumer_group_instance_id=f"{APP_ID}-worker",
)


def protobuf_table(name: str, changelog: TopicSpec) -> TableT[str, bytes]:
    """A table of serialized protobuf messages by id, kept in memory.

    faust names the changelog ``<app id>-<name>-changelog``; it must be the topic
    the config declares (created in advance, compacted), or the table would be
    recovered from, and written to, a topic nobody created.
    """
    table: TableT[str, bytes] = app.Table(
        name,
        key_type=str,
        value_type=bytes,
        partitions=changelog.partitions,
        help=f"{name} by id, serialized protobuf",
    )
    derived = table.changelog_topic.get_topic_name()
    if derived != changelog.name:
        raise RuntimeError(
            f"table {name!r} would use changelog {derived!r}, but the topic config names "
            f"{changelog.name!r}; set QM_PROJECTOR_APP_ID or QM_TOPICS to agree"
        )
    return table
