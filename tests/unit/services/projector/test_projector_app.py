"""The app's configuration: changelogs agree with the topic config, env decides the rest."""

from __future__ import annotations

import os
import subprocess
import sys

from services.projector.app import TOPICS, app
from services.projector.jobs.tables import job_specs, job_tasks, jobs
from services.projector.nodes.tables import nodes


def test_changelogs_are_the_configured_topics() -> None:
    for table, topic in (
        (jobs, TOPICS.jobs_view),
        (job_specs, TOPICS.job_specs_view),
        (job_tasks, TOPICS.job_tasks_view),
        (nodes, TOPICS.nodes_view),
    ):
        assert table.changelog_topic.get_topic_name() == topic.name
        assert table.partitions == topic.partitions == TOPICS.events.partitions
    assert app.conf.topic_partitions == TOPICS.events.partitions


def run_app(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    ours = ("QM_PROJECTOR_", "QM_LOOKBACK_WINDOW_S", "QM_SNAPSHOT_SECONDS")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_defaults_and_environment() -> None:
    show = (
        "from services.projector.app import app; c = app.conf; print(c.id, c.web_bind, c.web_port)"
    )
    assert run_app(show).stdout.split() == ["qm-projector", "127.0.0.1", "6066"]
    moved = run_app(show, QM_PROJECTOR_HOST="0.0.0.0", QM_PROJECTOR_PORT="7070")
    assert moved.stdout.split() == ["qm-projector", "0.0.0.0", "7070"]


def test_an_app_id_that_disagrees_with_the_changelog_names_fails_fast() -> None:
    result = run_app("import services.projector.jobs.tables", QM_PROJECTOR_APP_ID="qm-other")
    assert result.returncode != 0
    assert "would use changelog 'qm-other-jobs-changelog'" in result.stderr


def test_usage_settings_default_to_the_policy_and_are_checked() -> None:
    show = (
        "from services.projector.usage import state; print(state.WINDOW_S, state.SNAPSHOT_SECONDS)"
    )
    assert run_app(show).stdout.split() == ["604800.0", "10.0"]
    moved = run_app(show, QM_LOOKBACK_WINDOW_S="3600", QM_SNAPSHOT_SECONDS="2.5")
    assert moved.stdout.split() == ["3600.0", "2.5"]
    for bad, expected in [("0", "a number > 0"), ("nan", "a finite number"), ("often", "a number")]:
        result = run_app(show, QM_SNAPSHOT_SECONDS=bad)
        assert result.returncode != 0
        assert f'QM_SNAPSHOT_SECONDS: expected {expected}, got "{bad}"' in result.stderr
