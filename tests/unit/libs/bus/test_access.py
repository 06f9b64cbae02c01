"""The bus's grants: each service may do only what its work needs, by topic role, and the
Kubernetes manifests declare exactly the grants the local broker enforces."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from libs.bus.access import PRINCIPALS, Grant, grants
from libs.bus.strimzi import kafka_topics, render
from libs.bus.topics import load_topic_config

ROOT = Path(__file__).resolve().parents[4]
TOPICS = load_topic_config(ROOT / "deploy" / "topics.yaml")
K8S = ROOT / "deploy" / "k8s" / "base"


def allowed(who: str, operation: str, topic: str) -> bool:
    return Grant(who, "topic", topic, "literal", operation) in grants(TOPICS)


def test_only_placement_writes_decisions() -> None:
    writers = {p.name for p in PRINCIPALS if allowed(p.name, "Write", TOPICS.decisions.name)}
    assert writers == {"placement"}


def test_node_agents_read_decisions_and_nothing_else() -> None:
    [agent] = [p for p in PRINCIPALS if p.name == "node-agent"]
    assert agent.reads == ("decisions",)
    assert not allowed("node-agent", "Read", TOPICS.events.name)
    assert not allowed("node-agent", "Write", TOPICS.decisions.name)


def test_the_auditor_changes_nothing() -> None:
    mine = [g for g in grants(TOPICS) if g.principal == "auditor"]
    assert {g.operation for g in mine} == {"Read", "Describe"}
    assert ("group", "Read") not in {(g.resource, g.operation) for g in mine}  # cannot join


def test_every_writer_may_look_up_the_topic_it_writes() -> None:
    for rule in grants(TOPICS):
        if rule.resource == "topic" and rule.operation == "Write":
            assert replace(rule, operation="Describe") in grants(TOPICS)


def test_grants_follow_the_topic_names_of_the_file(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "topics.yaml").read_text())
    config["topics"]["decisions"]["name"] = "east.decisions"
    (tmp_path / "topics.yaml").write_text(yaml.safe_dump(config))
    renamed = load_topic_config(tmp_path / "topics.yaml")
    assert Grant("placement", "topic", "east.decisions", "literal", "Write") in grants(renamed)
    assert not [g for g in grants(renamed) if g.name == TOPICS.decisions.name]


def test_the_kubernetes_topics_and_users_are_the_generated_ones() -> None:
    expected = render(load_topic_config(K8S / "config" / "topics.yaml"))
    assert (K8S / "kafka" / "topics-and-users.yaml").read_text() == expected, (
        "regenerate: python -m libs.bus.strimzi deploy/k8s/base/config/topics.yaml "
        "> deploy/k8s/base/kafka/topics-and-users.yaml"
    )


def test_every_topic_is_a_kafka_topic_with_a_dns_name_and_its_settings() -> None:
    resources = {r["spec"]["topicName"]: r for r in kafka_topics(TOPICS)}
    assert set(resources) == {spec.name for spec in TOPICS.all()}
    for spec in TOPICS.all():
        resource = resources[spec.name]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", resource["metadata"]["name"])
        assert resource["spec"] == {
            "topicName": spec.name,
            "partitions": spec.partitions,
            "replicas": spec.replication_factor,
            "config": spec.configs(),
        }
    assert resources[TOPICS.jobs_view.name]["spec"]["config"] == {"cleanup.policy": "compact"}


def test_two_topics_of_one_kafka_topic_name_are_refused(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "topics.yaml").read_text())
    config["topics"]["decisions"]["name"] = "QM.Events"
    (tmp_path / "topics.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="one KafkaTopic name"):
        kafka_topics(load_topic_config(tmp_path / "topics.yaml"))
